#include "cluster/etcd.h"

#include "base/base64.h"
#include "base/strings.h"

namespace dsec::etcd {

namespace {

int64_t Int64Field(const Json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return 0;  // proto3 leaves zero values out
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) return ParseInt64(it->get<std::string>()).value_or(0);
  return 0;
}

std::string B64Field(const Json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_string()) return {};
  return Base64Decode(it->get<std::string>()).value_or(std::string());
}

KeyValue KvFrom(const Json& kv) {
  KeyValue out;
  out.key = B64Field(kv, "key");
  out.value = B64Field(kv, "value");
  out.mod_revision = Int64Field(kv, "mod_revision");
  out.lease = Int64Field(kv, "lease");
  return out;
}

}  // namespace

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char c = static_cast<unsigned char>(end.back());
    if (c < 0xff) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

StatusOr<std::vector<std::string>> ParseEndpoints(const std::string& spec) {
  std::vector<std::string> out;
  for (auto part : SplitString(spec, ',', /*skip_empty=*/true)) {
    std::string e(TrimWhitespace(part));
    if (StartsWith(e, "etcd://")) e = "http://" + e.substr(7);
    std::string host;
    uint16_t port = 0;
    if (Status s = http::ParseHttpUrl(e, &host, &port); !s.ok())
      return InvalidArgument("etcd endpoint \"" + std::string(part) +
                             "\" must be etcd://HOST:PORT or http://HOST:PORT");
    out.push_back("http://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) +
                  ":" + std::to_string(port));
  }
  if (out.empty()) return InvalidArgument("no etcd endpoint in \"" + spec + "\"");
  return out;
}

Client::Client(std::vector<std::string> endpoints, std::chrono::milliseconds timeout)
    : urls_(std::move(endpoints)), timeout_(timeout) {
  for (const auto& u : urls_) {
    std::string host;
    uint16_t port = 0;
    (void)http::ParseHttpUrl(u, &host, &port);  // checked by ParseEndpoints
    clients_.push_back(std::make_unique<http::HttpClient>(host, port, 8));
  }
}

StatusOr<Json> Client::Call(const std::string& path, const Json& body) {
  if (clients_.empty()) return Unavailable("etcd: no endpoints");
  const std::string text = body.dump();
  const http::Headers headers = {{"Content-Type", "application/json"}};
  Status last = OkStatus();
  size_t first = preferred_.load();
  for (size_t i = 0; i < clients_.size(); ++i) {
    size_t k = (first + i) % clients_.size();
    auto r = clients_[k]->Request("POST", "/v3/" + path, headers, text, timeout_, 16 << 20);
    if (!r.ok()) {
      last = Unavailable("etcd " + urls_[k] + ": " + r.status().message());
      continue;
    }
    Json j = Json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    if (r->status != 200 || j.is_discarded() || !j.is_object()) {
      std::string msg = j.is_object() && j.contains("message") && j["message"].is_string()
                            ? j["message"].get<std::string>()
                            : r->body.substr(0, 200);
      // etcd answered: a request error is the same on every member.
      if (r->status >= 400 && r->status < 500)
        return FailedPrecondition("etcd " + path + ": " + msg);
      last = Unavailable("etcd " + urls_[k] + " " + path + ": HTTP " + std::to_string(r->status) +
                         " " + msg);
      continue;
    }
    preferred_.store(k);
    return j;
  }
  return last;
}

StatusOr<int64_t> Client::Put(const std::string& key, const std::string& value, int64_t lease) {
  Json body = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  DSEC_ASSIGN_OR_RETURN(Json j, Call("kv/put", body));
  return Int64Field(j.value("header", Json::object()), "revision");
}

Status Client::Delete(const std::string& key) {
  return Call("kv/deleterange", {{"key", Base64Encode(key)}}).status();
}

StatusOr<bool> Client::Txn(const std::vector<Condition>& when,
                           const std::vector<std::pair<std::string, std::string>>& puts,
                           const std::vector<std::string>& deletes) {
  std::vector<TxnPut> p;
  p.reserve(puts.size());
  for (const auto& [k, v] : puts) p.push_back({k, v, 0});
  int64_t revision = 0;
  return TxnAt(when, p, deletes, &revision);
}

StatusOr<bool> Client::TxnAt(const std::vector<Condition>& when, const std::vector<TxnPut>& puts,
                             const std::vector<std::string>& deletes, int64_t* revision) {
  // (The gateway's JSON leaves out zero values: "create_revision": "0" with the default
  // EQUAL compare reads "the key was never created"; GREATER than 0, "it exists".)
  Json compare = Json::array(), success = Json::array();
  for (const auto& c : when) {
    Json cmp = {{"key", Base64Encode(c.key)}};
    switch (c.kind) {
      case Condition::kAbsent:
        cmp["target"] = "CREATE";
        cmp["create_revision"] = "0";
        break;
      case Condition::kPresent:
        cmp["target"] = "CREATE";
        cmp["result"] = "GREATER";
        cmp["create_revision"] = "0";
        break;
      case Condition::kValueIs:
        cmp["target"] = "VALUE";
        cmp["value"] = Base64Encode(c.value);
        break;
    }
    compare.push_back(std::move(cmp));
  }
  for (const auto& p : puts) {
    Json put = {{"key", Base64Encode(p.key)}, {"value", Base64Encode(p.value)}};
    if (p.lease != 0) put["lease"] = std::to_string(p.lease);
    success.push_back({{"requestPut", std::move(put)}});
  }
  for (const auto& k : deletes) {
    if (!k.empty() && k.back() == '*') {
      const std::string prefix = k.substr(0, k.size() - 1);
      success.push_back(
          {{"requestDeleteRange",
            {{"key", Base64Encode(prefix)}, {"range_end", Base64Encode(PrefixEnd(prefix))}}}});
    } else {
      success.push_back({{"requestDeleteRange", {{"key", Base64Encode(k)}}}});
    }
  }
  DSEC_ASSIGN_OR_RETURN(Json j, Call("kv/txn", {{"compare", compare}, {"success", success}}));
  *revision = 0;
  if (auto h = j.find("header"); h != j.end() && h->is_object())
    if (auto r = h->find("revision"); r != h->end() && r->is_string())
      *revision = ParseInt64(r->get<std::string>()).value_or(0);
  return j.value("succeeded", false);
}

StatusOr<bool> Client::PutIfAbsent(const std::vector<std::pair<std::string, std::string>>& puts,
                                   const std::vector<std::string>& absent) {
  std::vector<Condition> when;
  for (const auto& k : absent) when.push_back({k, Condition::kAbsent, ""});
  return Txn(when, puts);
}

Status Client::DeleteAll(const std::vector<std::string>& keys) {
  return Txn({}, {}, keys).status();
}

StatusOr<std::vector<KeyValue>> Client::RangePrefix(const std::string& prefix, int64_t* revision) {
  DSEC_ASSIGN_OR_RETURN(Json j, Call("kv/range", {{"key", Base64Encode(prefix)},
                                                  {"range_end", Base64Encode(PrefixEnd(prefix))}}));
  if (revision) *revision = Int64Field(j.value("header", Json::object()), "revision");
  std::vector<KeyValue> out;
  if (auto it = j.find("kvs"); it != j.end() && it->is_array())
    for (const auto& kv : *it) out.push_back(KvFrom(kv));
  return out;
}

StatusOr<std::optional<KeyValue>> Client::Get(const std::string& key) {
  DSEC_ASSIGN_OR_RETURN(Json j, Call("kv/range", {{"key", Base64Encode(key)}}));
  if (auto it = j.find("kvs"); it != j.end() && it->is_array() && !it->empty())
    return std::optional<KeyValue>(KvFrom(it->front()));
  return std::optional<KeyValue>();
}

StatusOr<int64_t> Client::LeaseGrant(int64_t ttl_s) {
  DSEC_ASSIGN_OR_RETURN(Json j, Call("lease/grant", {{"TTL", std::to_string(ttl_s)}}));
  int64_t id = Int64Field(j, "ID");
  if (id == 0) return Unavailable("etcd lease/grant: no lease id in the answer");
  return id;
}

StatusOr<int64_t> Client::LeaseKeepAlive(int64_t id) {
  DSEC_ASSIGN_OR_RETURN(Json j, Call("lease/keepalive", {{"ID", std::to_string(id)}}));
  // One message of the keepalive stream: {"result": {"ID": ..., "TTL": ...}}; TTL 0 (left
  // out) means the lease is gone.
  const Json& r = j.contains("result") ? j["result"] : j;
  int64_t ttl = Int64Field(r, "TTL");
  if (ttl <= 0) return NotFound("etcd lease " + std::to_string(id) + " has expired");
  return ttl;
}

Status Client::LeaseRevoke(int64_t id) {
  return Call("lease/revoke", {{"ID", std::to_string(id)}}).status();
}

Status Client::Watch(const std::string& prefix, int64_t start_revision,
                     const std::function<void(const std::vector<Event>&, int64_t)>& on_events,
                     const std::atomic<bool>* stop) {
  Json req = {{"create_request",
               {{"key", Base64Encode(prefix)},
                {"range_end", Base64Encode(PrefixEnd(prefix))},
                {"start_revision", std::to_string(start_revision)},
                {"progress_notify", true}}}};
  const std::string text = req.dump();
  Status last = Unavailable("etcd: no endpoints");
  size_t first = preferred_.load();
  for (size_t i = 0; i < clients_.size(); ++i) {
    size_t k = (first + i) % clients_.size();
    std::string pending;
    int status = 0;
    Status result = OkStatus();
    // etcd sends a progress notification every few minutes at most when idle; the idle
    // deadline only catches a dead connection (the edges' load updates keep it busy anyway).
    Status s = clients_[k]->Stream(
        "POST", "/v3/watch", {{"Content-Type", "application/json"}}, text,
        std::chrono::milliseconds(2000), std::chrono::minutes(15), stop,
        [&](int st, const http::Headers&) { status = st; },
        [&](std::string_view data) {
          if (status != 200) return false;
          pending.append(data);
          size_t nl;
          while ((nl = pending.find('\n')) != std::string::npos) {
            std::string line = pending.substr(0, nl);
            pending.erase(0, nl + 1);
            if (TrimWhitespace(line).empty()) continue;
            Json j = Json::parse(line, nullptr, false);
            if (j.is_discarded() || !j.is_object()) continue;
            if (j.contains("error")) {
              result = Unavailable("etcd watch: " + j["error"].dump());
              return false;
            }
            const Json& r = j.value("result", Json::object());
            if (r.value("canceled", false)) {
              int64_t compact = Int64Field(r, "compact_revision");
              result = compact > 0
                           ? FailedPrecondition("etcd watch: revision " +
                                                std::to_string(start_revision) + " was compacted")
                           : Unavailable("etcd watch canceled");
              return false;
            }
            int64_t rev = Int64Field(r.value("header", Json::object()), "revision");
            std::vector<Event> events;
            if (auto it = r.find("events"); it != r.end() && it->is_array()) {
              for (const auto& e : *it) {
                Event ev;
                ev.deleted = e.value("type", "") == "DELETE";
                ev.kv = KvFrom(e.value("kv", Json::object()));
                events.push_back(std::move(ev));
              }
            }
            on_events(events, rev);
          }
          return true;
        });
    if (!result.ok()) return result;
    if (stop && stop->load()) return OkStatus();
    if (status != 0 && status != 200)
      return Unavailable("etcd watch: HTTP " + std::to_string(status));
    last = s.ok() ? Unavailable("etcd watch: the stream ended") : s;
    if (status == 200) return last;  // it was connected: the caller reads the range again
  }
  return last;
}

}  // namespace dsec::etcd
