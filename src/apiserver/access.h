// Who may do what in a cluster (issue 37): projects and the tokens of each, kept in etcd and
// held in memory by every apiserver from its one watch on /dsec/ (ClusterView forwards the keys
// under /dsec/projects/ and /dsec/tokens/). A call is authenticated without reading etcd.
//
// A token is shown once, when it is made; etcd holds only its keyed hash (HMAC-SHA256 with a key
// derived from the node token, which every apiserver of the cluster has and etcd does not), as
// the key /dsec/tokens/<project>/<hash hex> of a record {name, project, project_created_at,
// role, created_at, expires_at}, with /dsec/token-names/<project>/<name> naming that key. A
// revoke deletes the keys: every apiserver's watch drops them (well within a second). A token
// holds only while its project exists as it was when the token was made (a project removed
// and made again under the same name does not revive old tokens).
//
// The cluster tokens of --token-file stay what they were: admin of the `default` project.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/mutex.h"
#include "base/status.h"
#include "cluster/etcd.h"

namespace dsec::apiserver {

inline constexpr std::string_view kProjectsPrefix = "/dsec/projects/";
inline constexpr std::string_view kTokensPrefix = "/dsec/tokens/";
inline constexpr std::string_view kTokenNamesPrefix = "/dsec/token-names/";
// When a token was last used: /dsec/token-used/<project>/<hash hex> = ms, written by each
// apiserver at most once a minute per token (TokenUses): a busy token costs a write a minute.
inline constexpr std::string_view kTokenUsedPrefix = "/dsec/token-used/";
inline constexpr std::string_view kDefaultProject = "default";

// admin: projects, tokens and nodes, and sandboxes in any project; member: sandboxes, fncalls
// and jobs of its project; viewer: reads them.
enum class Role { kViewer, kMember, kAdmin };
std::string_view RoleName(Role r);
StatusOr<Role> ParseRole(std::string_view s);

// The caller of a request, once authenticated.
struct Principal {
  std::string token;    // the token's name ("cluster" for a --token-file token)
  std::string project;  // the project it belongs to
  Role role = Role::kViewer;
  // The request's form: "role:project:token" (HttpRequest::principal), and back.
  std::string Encode() const;
  static std::optional<Principal> Decode(std::string_view s);
};

struct TokenRecord {
  std::string name, project;
  int64_t project_created_at = 0;  // which project of that name (0: default)
  Role role = Role::kMember;
  int64_t created_at = 0;  // ms since the epoch
  int64_t expires_at = 0;  // ms; 0: never
  int64_t last_used = 0;   // ms, as far as known (not stored in the record: kTokenUsedPrefix)
  Json ToJson() const;     // as stored and as listed (never the token itself)
  static StatusOr<TokenRecord> FromJson(std::string_view text);
};

struct ProjectRecord {
  std::string name;
  int64_t created_at = 0;
  Json ToJson() const;
  static StatusOr<ProjectRecord> FromJson(std::string_view text);
};

// Project and token names: 1-63 of a-z 0-9 - (a DNS label: they show up in ids and labels).
Status ValidateAccessName(std::string_view what, std::string_view name);

class AccessView {
 public:
  // `hash_key`: the key of the tokens' keyed hash (derived from the node token).
  explicit AccessView(std::string hash_key);

  // The keyed hash of a token, as hex: its etcd key below kTokensPrefix.
  std::string TokenHash(std::string_view token) const;
  // A new random token ("dsec_" and 43 base32 characters, 215 bits).
  static std::string NewToken();

  // The project token's caller, or nullopt (unknown, expired). Notes the use (TokenUses).
  std::optional<Principal> Authenticate(std::string_view token, int64_t now_ms);
  // The uses to write to etcd now: tokens used since their last write here, at most one write
  // a minute each (`interval_ms`): (key under kTokenUsedPrefix, ms).
  std::vector<std::pair<std::string, int64_t>> TokenUses(int64_t now_ms,
                                                         int64_t interval_ms = 60000);

  bool ProjectExists(std::string_view name) const;  // "default" always does
  std::vector<ProjectRecord> Projects() const;
  // When the project was made (0 for default); nullopt if it does not exist.
  std::optional<int64_t> ProjectCreatedAt(std::string_view name) const;
  // When the project's token `name` expires (0: never); nullopt if there is no such token.
  std::optional<int64_t> TokenExpiry(std::string_view project, std::string_view name) const;
  // The tokens of a project, with their etcd keys.
  std::vector<std::pair<std::string, TokenRecord>> Tokens(std::string_view project) const;

  // From the watch (ClusterView): keys under kProjectsPrefix and kTokensPrefix; others ignored.
  void ApplyPut(const std::string& key, const std::string& value);
  void ApplyDelete(const std::string& key);
  // After a fresh range read: exactly these keys (of every prefix) are present.
  void Reset(const std::vector<etcd::KeyValue>& kvs);
  // Called (outside the view's lock) for each token that goes (revoked, or its project
  // removed), by project and name: the apiserver closes what it relays for it.
  void SetOnRevoke(std::function<void(const std::string& project, const std::string& name)> fn);

 private:
  const std::string key_;
  mutable Mutex mu_;
  std::function<void(const std::string&, const std::string&)> on_revoke_ DSEC_GUARDED_BY(mu_);
  std::map<std::string, ProjectRecord> projects_ DSEC_GUARDED_BY(mu_);
  std::map<std::string, TokenRecord> tokens_ DSEC_GUARDED_BY(mu_);  // by hash hex
  std::map<std::string, int64_t> used_ DSEC_GUARDED_BY(mu_);        // hash -> last use
  struct Written {
    int64_t use = 0, at = 0;  // the use written, when it was written
  };
  std::map<std::string, Written> written_ DSEC_GUARDED_BY(mu_);
};

}  // namespace dsec::apiserver
