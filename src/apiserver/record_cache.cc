#include "apiserver/record_cache.h"

#include <cstdio>

#include "base/strings.h"

namespace dsec::apiserver {
namespace {

// "<created_at>.<id>" in an order strings keep: the time zero-padded to 20 digits.
std::string OrderKey(int64_t created_at, const std::string& id) {
  char t[24];
  snprintf(t, sizeof t, "%020lld", static_cast<long long>(created_at < 0 ? 0 : created_at));
  return StrCat({t, ".", id});
}

// A list position ("<created_at>.<id>", as the apiserver's cursor holds it) as an OrderKey.
std::string KeyOfPosition(const std::string& pos) {
  const size_t dot = pos.find('.');
  if (dot == std::string::npos) return "";
  auto t = ParseInt64(pos.substr(0, dot));
  return t ? OrderKey(*t, pos.substr(dot + 1)) : "";
}

int64_t IntField(const Json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

std::string StringField(const Json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

bool RecordFilter::Matches(const Json& record) const {
  if (!state.empty() && StringField(record, "state") != state) return false;
  if (!kind.empty() && StringField(record, "kind") != kind) return false;
  if (!project.empty() && StringField(record, "project") != project) return false;
  auto l = record.find("labels");
  for (const auto& [k, v] : labels) {
    if (l == record.end() || !l->is_object()) return false;
    auto it = l->find(k);
    if (it == l->end() || !it->is_string() || it->get<std::string>() != v) return false;
  }
  return true;
}

void RecordCache::Put(const Json& record) {
  if (!record.is_object() || capacity_ == 0) return;
  std::string id = StringField(record, "id"), node = StringField(record, "node");
  if (id.empty() || node.empty()) return;
  Entry e{id, node, OrderKey(IntField(record, "created_at"), id), IntField(record, "expires_at"),
          record};
  MutexLock l(mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) EraseLocked(it->second);
  lru_.push_front(std::move(e));
  by_id_[id] = lru_.begin();
  by_node_[node][lru_.front().key] = lru_.begin();
  while (lru_.size() > capacity_) EraseLocked(std::prev(lru_.end()));
}

void RecordCache::PutAll(const Json& answer) {
  if (!answer.is_object()) return;
  auto all = answer.find("sandboxes");
  if (all == answer.end()) return Put(answer);
  if (!all->is_array()) return;
  for (const Json& r : *all) Put(r);
}

void RecordCache::Erase(const std::string& id) {
  MutexLock l(mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) EraseLocked(it->second);
}

void RecordCache::EraseLocked(std::list<Entry>::iterator it) {
  auto n = by_node_.find(it->node);
  if (n != by_node_.end()) {
    n->second.erase(it->key);
    if (n->second.empty()) by_node_.erase(n);
  }
  by_id_.erase(it->id);
  lru_.erase(it);
}

std::optional<Json> RecordCache::Get(const std::string& id, int64_t now_ms) {
  MutexLock l(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  if (it->second->expires_at > 0 && it->second->expires_at <= now_ms) {
    EraseLocked(it->second);
    return std::nullopt;
  }
  return it->second->record;
}

std::vector<Json> RecordCache::OfNode(const std::string& node, const std::string& after,
                                      const RecordFilter& filter, size_t limit, int64_t now_ms,
                                      bool* more) {
  *more = false;
  std::vector<Json> out;
  MutexLock l(mu_);
  auto n = by_node_.find(node);
  if (n == by_node_.end()) return out;
  const std::string from = after.empty() ? "" : KeyOfPosition(after);
  auto it = from.empty() ? n->second.begin() : n->second.upper_bound(from);
  for (; it != n->second.end(); ++it) {
    const Entry& e = *it->second;
    if ((e.expires_at > 0 && e.expires_at <= now_ms) || !filter.Matches(e.record)) continue;
    if (out.size() == limit) {
      *more = true;
      break;
    }
    out.push_back(e.record);
  }
  return out;
}

size_t RecordCache::size() const {
  MutexLock l(mu_);
  return lru_.size();
}

Json RecordCache::Unavailable(Json record, const std::string& why) {
  record["state"] = "unavailable";
  record["reason"] = why;
  return record;
}

}  // namespace dsec::apiserver
