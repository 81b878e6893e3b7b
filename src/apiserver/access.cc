#include "apiserver/access.h"

#include <algorithm>

#include "api/ports_json.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/strings.h"
#include "http/auth.h"

namespace dsec::apiserver {

std::string_view RoleName(Role r) {
  switch (r) {
    case Role::kAdmin:
      return "admin";
    case Role::kMember:
      return "member";
    case Role::kViewer:
      return "viewer";
  }
  return "viewer";
}

StatusOr<Role> ParseRole(std::string_view s) {
  if (s == "admin") return Role::kAdmin;
  if (s == "member") return Role::kMember;
  if (s == "viewer") return Role::kViewer;
  return InvalidArgument("role must be admin, member or viewer, not \"" + std::string(s) + "\"");
}

std::string Principal::Encode() const { return StrCat({RoleName(role), ":", project, ":", token}); }

std::optional<Principal> Principal::Decode(std::string_view s) {
  size_t a = s.find(':');
  size_t b = a == std::string_view::npos ? a : s.find(':', a + 1);
  if (b == std::string_view::npos) return std::nullopt;
  auto role = ParseRole(s.substr(0, a));
  if (!role.ok()) return std::nullopt;
  Principal p;
  p.role = *role;
  p.project = std::string(s.substr(a + 1, b - a - 1));
  p.token = std::string(s.substr(b + 1));
  return p;
}

Json TokenRecord::ToJson() const {
  Json j = {{"name", name},
            {"project", project},
            {"project_created_at", project_created_at},
            {"role", RoleName(role)},
            {"created_at", created_at},
            {"expires_at", expires_at > 0 ? Json(expires_at) : Json(nullptr)}};
  if (last_used > 0) j["last_used"] = last_used;
  return j;
}

StatusOr<TokenRecord> TokenRecord::FromJson(std::string_view text) {
  Json j = Json::parse(text, nullptr, false);
  if (!j.is_object()) return InvalidArgument("a token record is not a JSON object");
  TokenRecord r;
  try {
    r.name = j.at("name").get<std::string>();
    r.project = j.at("project").get<std::string>();
    DSEC_ASSIGN_OR_RETURN(r.role, ParseRole(j.at("role").get<std::string>()));
    r.created_at = j.value("created_at", int64_t{0});
    r.project_created_at = j.value("project_created_at", int64_t{0});
    if (auto e = j.find("expires_at"); e != j.end() && e->is_number_integer())
      r.expires_at = e->get<int64_t>();
  } catch (const Json::exception& e) {
    return InvalidArgument(std::string("a token record: ") + e.what());
  }
  return r;
}

Json ProjectRecord::ToJson() const { return {{"name", name}, {"created_at", created_at}}; }

StatusOr<ProjectRecord> ProjectRecord::FromJson(std::string_view text) {
  Json j = Json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string())
    return InvalidArgument("a project record is not {\"name\": ...}");
  return ProjectRecord{j["name"].get<std::string>(), j.value("created_at", int64_t{0})};
}

Status ValidateAccessName(std::string_view what, std::string_view name) {
  if (!api::IsDnsLabel(name))
    return InvalidArgument(std::string(what) + " must be 1-63 characters of a-z 0-9 - (not " +
                           "starting or ending with -), not \"" + std::string(name) + "\"");
  return OkStatus();
}

AccessView::AccessView(std::string hash_key) : key_(std::move(hash_key)) {}

std::string AccessView::TokenHash(std::string_view token) const {
  return HexEncode(http::HmacSha256(key_, token));
}

std::optional<int64_t> AccessView::TokenExpiry(std::string_view project,
                                               std::string_view name) const {
  MutexLock l(mu_);
  for (const auto& [h, t] : tokens_)
    if (t.project == project && t.name == name) return t.expires_at;
  return std::nullopt;
}

std::string AccessView::NewToken() { return "dsec_" + RandomBase32(43); }

std::optional<Principal> AccessView::Authenticate(std::string_view token, int64_t now_ms) {
  if (token.empty()) return std::nullopt;
  const std::string h = TokenHash(token);
  MutexLock l(mu_);
  auto it = tokens_.find(h);
  if (it == tokens_.end()) return std::nullopt;
  const TokenRecord& r = it->second;
  if (r.expires_at > 0 && r.expires_at <= now_ms) return std::nullopt;
  // Its project, as it was when the token was made.
  if (r.project != kDefaultProject) {
    auto p = projects_.find(r.project);
    if (p == projects_.end() || p->second.created_at != r.project_created_at) return std::nullopt;
  }
  int64_t& u = used_[h];
  u = std::max(u, now_ms);
  return Principal{r.name, r.project, r.role};
}

std::vector<std::pair<std::string, int64_t>> AccessView::TokenUses(int64_t now_ms,
                                                                   int64_t interval_ms) {
  std::vector<std::pair<std::string, int64_t>> out;
  MutexLock l(mu_);
  for (const auto& [h, use] : used_) {
    auto t = tokens_.find(h);
    if (t == tokens_.end()) continue;  // revoked
    Written& w = written_[h];
    if (use <= w.use || now_ms - w.at < interval_ms) continue;
    out.emplace_back(StrCat({kTokenUsedPrefix, t->second.project, "/", h}), use);
    w = {use, now_ms};
  }
  return out;
}

std::optional<int64_t> AccessView::ProjectCreatedAt(std::string_view name) const {
  if (name == kDefaultProject) return 0;
  MutexLock l(mu_);
  auto it = projects_.find(std::string(name));
  if (it == projects_.end()) return std::nullopt;
  return it->second.created_at;
}

bool AccessView::ProjectExists(std::string_view name) const {
  if (name == kDefaultProject) return true;
  MutexLock l(mu_);
  return projects_.count(std::string(name)) > 0;
}

std::vector<ProjectRecord> AccessView::Projects() const {
  MutexLock l(mu_);
  std::vector<ProjectRecord> out;
  if (!projects_.count(std::string(kDefaultProject)))
    out.push_back(ProjectRecord{std::string(kDefaultProject), 0});
  for (const auto& [name, p] : projects_) out.push_back(p);
  std::sort(out.begin(), out.end(),
            [](const ProjectRecord& a, const ProjectRecord& b) { return a.name < b.name; });
  return out;
}

std::vector<std::pair<std::string, TokenRecord>> AccessView::Tokens(
    std::string_view project) const {
  MutexLock l(mu_);
  std::vector<std::pair<std::string, TokenRecord>> out;
  for (const auto& [hash, t] : tokens_) {
    if (t.project != project) continue;
    out.emplace_back(StrCat({kTokensPrefix, project, "/", hash}), t);
    if (auto u = used_.find(hash); u != used_.end())
      out.back().second.last_used = std::max(out.back().second.last_used, u->second);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.second.name < b.second.name; });
  return out;
}

void AccessView::ApplyPut(const std::string& key, const std::string& value) {
  if (StartsWith(key, kProjectsPrefix)) {
    auto p = ProjectRecord::FromJson(value);
    if (!p.ok() || p->name != key.substr(kProjectsPrefix.size())) {
      DSEC_LOG_WARN("access: ignoring a bad project record at {}", key);
      return;
    }
    MutexLock l(mu_);
    projects_[p->name] = std::move(*p);
  } else if (StartsWith(key, kTokenUsedPrefix)) {
    // Another apiserver's (or this one's) note of a use.
    auto ms = ParseInt64(value);
    if (!ms) return;
    MutexLock l(mu_);
    int64_t& u = used_[key.substr(key.rfind('/') + 1)];
    u = std::max(u, *ms);
  } else if (StartsWith(key, kTokensPrefix)) {
    auto t = TokenRecord::FromJson(value);
    if (!t.ok()) {
      DSEC_LOG_WARN("access: ignoring a bad token record ({})", t.status().message());
      return;
    }
    MutexLock l(mu_);
    tokens_[key.substr(key.rfind('/') + 1)] = std::move(*t);
  }
}

void AccessView::SetOnRevoke(
    std::function<void(const std::string& project, const std::string& name)> fn) {
  MutexLock l(mu_);
  on_revoke_ = std::move(fn);
}

void AccessView::ApplyDelete(const std::string& key) {
  std::optional<TokenRecord> gone;
  std::function<void(const std::string&, const std::string&)> hook;
  {
    MutexLock l(mu_);
    hook = on_revoke_;
    if (StartsWith(key, kProjectsPrefix)) {
      projects_.erase(key.substr(kProjectsPrefix.size()));
    } else if (StartsWith(key, kTokensPrefix)) {
      auto it = tokens_.find(key.substr(key.rfind('/') + 1));
      if (it != tokens_.end()) {
        gone = it->second;
        tokens_.erase(it);
      }
    } else if (StartsWith(key, kTokenUsedPrefix)) {
      used_.erase(key.substr(key.rfind('/') + 1));
    }
  }
  if (gone && hook) hook(gone->project, gone->name);
}

void AccessView::Reset(const std::vector<etcd::KeyValue>& kvs) {
  // Parsed aside and swapped in: no token is missing for a moment.
  AccessView fresh(key_);
  for (const auto& kv : kvs) fresh.ApplyPut(kv.key, kv.value);
  std::vector<TokenRecord> gone;  // (deletes the watch missed while it was down)
  std::function<void(const std::string&, const std::string&)> hook;
  {
    MutexLock f(fresh.mu_);
    MutexLock l(mu_);
    hook = on_revoke_;
    for (const auto& [h, t] : tokens_)
      if (!fresh.tokens_.count(h)) gone.push_back(t);
    projects_.swap(fresh.projects_);
    tokens_.swap(fresh.tokens_);
    for (const auto& [h, u] : fresh.used_) used_[h] = std::max(used_[h], u);
  }
  if (hook)
    for (const auto& t : gone) hook(t.project, t.name);
}

}  // namespace dsec::apiserver
