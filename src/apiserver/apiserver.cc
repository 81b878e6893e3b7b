#include "apiserver/apiserver.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <set>
#include <thread>
#include <tuple>
#include <utility>  // before asio (Boost 1.74)

#include <boost/asio/post.hpp>

#include "api/errors.h"
#include "api/images_json.h"
#include "api/ports_json.h"
#include "api/quota_room.h"
#include "api/routes.h"
#include "base/base64.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/strings.h"
#include "http/auth.h"
#include "http/json_body.h"
#include "http/relay.h"
#include "images/store.h"

namespace dsec::apiserver {

namespace {

using std::chrono::milliseconds;

void Reply(const std::shared_ptr<http::Responder>& res, int status, const Json& body,
           http::Headers headers = {}) {
  http::HttpResponse r;
  r.status = status;
  r.body = body.dump();
  r.headers = std::move(headers);
  res->Send(std::move(r));
}

void Fail(const std::shared_ptr<http::Responder>& res, const Status& s) {
  auto [status, code] = api::HttpErrorFor(s.code());
  res->Send(http::JsonError(status, code, s.message()));
}

void Fail(const std::shared_ptr<http::Responder>& res, int status, std::string_view code,
          std::string_view message) {
  res->Send(http::JsonError(status, code, message));
}

// A node's answer, passed on as it came (with the node that gave it).
void PassOn(const std::shared_ptr<http::Responder>& res, const http::ClientResponse& r,
            const std::string& node) {
  http::HttpResponse out;
  out.status = r.status;
  std::string ct = r.Header("content-type");
  out.content_type = ct.empty() ? "application/json" : ct;
  out.body = r.body;
  out.headers.emplace_back("Dsec-Node", node);
  if (std::string ra = r.Header("retry-after"); !ra.empty())
    out.headers.emplace_back("Retry-After", ra);
  if (std::string q = r.Header("dsec-quota-exceeded"); !q.empty())
    out.headers.emplace_back("Dsec-Quota-Exceeded", q);
  res->Send(std::move(out));
}

// The error code and message of a node's JSON error body (the message: the body's start when
// it is not one); parsed once per answer.
struct NodeError {
  std::string code, message;
};
// "its lease lapsed N s ago" of an unavailable node.
std::string LeaseLapsed(const NodeState& n) {
  return "its lease lapsed " + std::to_string((WallMs() - n.changed_ms) / 1000) + " s ago";
}

// The 503 of a call on sandbox `id` whose node `n` is unavailable.
std::string Unreachable(const std::string& id, const NodeState& n) {
  return "node " + n.rec.node + " is unavailable: sandbox " + id +
         " cannot be reached until the node is back (" + LeaseLapsed(n) + ")";
}

NodeError ErrorOf(const http::ClientResponse& r) {
  Json j = Json::parse(r.body, nullptr, false);
  const Json* e =
      j.is_object() && j.contains("error") && j["error"].is_object() ? &j["error"] : nullptr;
  NodeError out;
  if (e && e->contains("code") && (*e)["code"].is_string())
    out.code = (*e)["code"].get<std::string>();
  if (e && e->contains("message") && (*e)["message"].is_string())
    out.message = (*e)["message"].get<std::string>();
  else
    out.message = r.body.substr(0, 200);
  return out;
}

}  // namespace

std::string PercentEncode(std::string_view s) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// The list cursor of the apiserver: where each node's listing stopped ("~": it has no more).
std::string EncodeCursor(const std::map<std::string, std::string>& at) {
  Json j = Json::object();
  for (const auto& [node, c] : at) j[node] = c;
  return Base64Encode(j.dump());
}

StatusOr<std::map<std::string, std::string>> DecodeCursor(const std::string& text) {
  auto raw = Base64Decode(text);
  Json j = raw ? Json::parse(*raw, nullptr, false) : Json();
  if (!j.is_object()) return InvalidArgument("bad cursor");
  std::map<std::string, std::string> out;
  for (const auto& item : j.items()) {
    if (!item.value().is_string()) return InvalidArgument("bad cursor");
    out[item.key()] = item.value().get<std::string>();
  }
  return out;
}

bool AdvanceListCursor(const std::vector<std::pair<std::string, std::string>>& page,
                       const std::map<std::string, std::pair<size_t, bool>>& returned,
                       std::map<std::string, std::string>* at) {
  std::map<std::string, size_t> taken;
  std::map<std::string, std::string> last_key;
  for (const auto& [node, key] : page) {
    ++taken[node];
    last_key[node] = key;
  }
  bool more = false;
  for (const auto& [node, r] : returned) {
    auto [count, has_more] = r;
    if (taken[node] == count && !has_more) {
      (*at)[node] = "~";
    } else {
      more = true;
      if (taken[node] > 0) (*at)[node] = last_key[node];
    }
  }
  return more;
}

std::string NodeOfSandbox(std::string_view id) {
  // "sb-" + node + "-" + 12 random base32 characters.
  constexpr size_t kRandom = 12;
  if (id.size() < 3 + 1 + 1 + kRandom || id.substr(0, 3) != "sb-") return {};
  if (id[id.size() - kRandom - 1] != '-') return {};
  return std::string(id.substr(3, id.size() - 3 - kRandom - 1));
}

Apiserver::Apiserver(ApiserverConfig cfg, std::vector<std::string> tokens, std::string node_token,
                     etcd::Client* etcd, ClusterView* view, AccessView* access, Quotas* quotas,
                     AuditLog* audit)
    : cfg_(std::move(cfg)),
      tokens_(std::move(tokens)),
      node_token_(std::move(node_token)),
      etcd_(etcd),
      view_(view),
      access_(access),
      quotas_(quotas),
      audit_(audit),
      records_(static_cast<size_t>(std::max<int64_t>(0, cfg_.record_cache))),
      workers_(static_cast<size_t>(std::max(4, cfg_.workers))),
      fanout_(static_cast<size_t>(std::max(4, cfg_.workers))) {
  // A revoked token (or its project removed) keeps nothing open: on every apiserver, as its
  // watch sees the delete.
  if (access_)
    access_->SetOnRevoke([this](const std::string& project, const std::string& name) {
      CutRelaysOf(project, name);
    });
}

void Apiserver::CutExpiredRelays(int64_t now_ms) {
  std::vector<std::string> expired;
  {
    MutexLock l(open_mu_);
    for (const auto& [opener, at] : open_expiry_)
      if (at > 0 && at <= now_ms && open_.count(opener)) expired.push_back(opener);
  }
  for (const auto& opener : expired) {
    const size_t slash = opener.find('/');
    CutRelaysOf(opener.substr(0, slash), opener.substr(slash + 1));
  }
}

void Apiserver::CutRelaysOf(const std::string& project, const std::string& name) {
  MutexLock l(open_mu_);
  auto it = open_.find(project + "/" + name);
  if (it == open_.end()) return;
  DSEC_LOG_INFO("audit: token {} of project {} is gone: closing its {} open relay(s)", name,
                project, it->second.size());
  for (auto& [id, fd] : it->second) ::shutdown(fd.get(), SHUT_RDWR);
}

void Apiserver::Shutdown() {
  workers_.stop();
  workers_.join();
  fanout_.stop();
  fanout_.join();
}

http::Preflight Apiserver::Check(http::HttpRequest& req) {
  http::Preflight pf;
  auto deny = [&](int status, std::string_view code, std::string_view msg) {
    pf.ok = false;
    pf.error = http::JsonError(status, code, msg);
    pf.error.close = true;
    if (status == 401) pf.error.headers.emplace_back("WWW-Authenticate", "Bearer");
    return pf;
  };
  int auth_headers = 0;
  for (const auto& [k, v] : req.headers) auth_headers += k == "authorization";
  if (auth_headers > 1) return deny(401, "unauthorized", "more than one Authorization header");
  auto relay_slot = [&]() -> bool {
    if (relays_.load() < cfg_.max_relays) return true;
    deny(429, "over_capacity",
         "the apiserver relays " + std::to_string(cfg_.max_relays) +
             " calls on sandboxes now (max_relays): retry");
    return false;
  };
  // A port host or a signed port URL carries its own credential, which only the sandbox's node
  // can check (its key): relayed as it came, without the node token (Relay).
  std::string port_id, port, port_target;
  api::SignedPortTarget spt;
  if (api::ParsePortHost(req.Header("host"), cfg_.port_domain, &port_id, &port) ||
      api::ParseSignedPortTarget(req.target, &spt)) {
    if (!relay_slot()) return pf;
    pf.takeover = true;
    pf.principal = "port";
    return pf;
  }
  auto who = Caller(req);
  if (!who)
    return deny(401, "unauthorized",
                http::BearerToken(req).empty() ? "missing bearer token" : "invalid token");
  // A project token is only as good as this apiserver's view of revocations: out of step with
  // etcd for longer than access_stale_ms, project tokens wait (the cluster tokens still work).
  if (const int64_t stale = view_->stale_since_ms();
      stale > 0 && !CallerIsCluster(req) && WallMs() - stale > cfg_.access_stale_ms)
    return deny(503, "unavailable",
                "this apiserver has not reached etcd for " +
                    std::to_string((WallMs() - stale) / 1000) +
                    " s: project tokens wait until it has (a revoke could be missed); retry");
  pf.principal = who->Encode();
  // The node routes the path it decodes from the target as sent: it must name the same thing
  // the apiserver checked (no "." or ".." segment, no encoded '/'), or a call the apiserver
  // let through as one sandbox's could reach another route of the node with the node token.
  std::string_view raw = std::string_view(req.target).substr(0, req.target.find('?'));
  for (auto part : SplitString(raw, '/', /*skip_empty=*/false)) {
    std::string seg;
    if (!http::PercentDecode(part, false, &seg) || seg == "." || seg == ".." ||
        seg.find('/') != std::string::npos)
      return deny(400, "bad_request", "the path must not hold \".\", \"..\" or an encoded '/'");
  }
  // Everything on one sandbox goes to its node as it comes, body and all: its routes in the
  // shared table, and the port proxy.
  const api::RouteSpec* r = api::MatchRoute(req.method, req.target, api::Server::kApiserver).route;
  // What the role may do: a viewer reads (no attach, no port proxy: both act on the sandbox);
  // managing projects, tokens and nodes is an admin's.
  const bool port_proxy = api::ParsePortTarget(req.target, &port_id, &port, &port_target);
  using api::RouteId;
  if (who->role == Role::kViewer &&
      ((req.method != "GET" && req.method != "HEAD") || req.websocket_upgrade || port_proxy ||
       (r && r->id == RouteId::kAttach)))
    return deny(403, "forbidden",
                "token " + who->token + " has the viewer role: it only reads (" + req.method + " " +
                    req.path + " needs member)");
  if (who->role != Role::kAdmin && r &&
      (r->id == RouteId::kCreateProject || r->id == RouteId::kDeleteProject ||
       r->id == RouteId::kListTokens || r->id == RouteId::kCreateToken ||
       r->id == RouteId::kDeleteToken || r->id == RouteId::kNodes || r->id == RouteId::kGetNode ||
       r->id == RouteId::kCordonNode || r->id == RouteId::kUncordonNode ||
       r->id == RouteId::kDrainNode || r->id == RouteId::kSetOrgQuota ||
       r->id == RouteId::kSetProjectQuota || r->id == RouteId::kReplaceProjectQuota ||
       r->id == RouteId::kSetTokenQuota))
    return deny(403, "forbidden",
                "token " + who->token + " has the " + std::string(RoleName(who->role)) +
                    " role: " + req.method + " " + req.path + " needs admin");
  // The project it acts in must be one it may (404 for one that does not exist).
  if (std::string named = req.Header("dsec-project"); !named.empty()) {
    if (who->role != Role::kAdmin && named != who->project)
      return deny(403, "forbidden",
                  "token " + who->token + " belongs to project " + who->project +
                      ", not to project " + named);
    if (!access_->ProjectExists(named)) return deny(404, "not_found", "no project " + named);
  }
  // (A record, GET /v1/sandboxes/{id}, is asked by the apiserver itself: it keeps what it
  // reads, to show while the node is unavailable.)
  // An image archive goes to the node that imports it, streamed.
  if ((r && r->scope == api::Scope::kSandbox && r->id != api::RouteId::kGetSandbox) || port_proxy ||
      (r && r->id == RouteId::kImportImage)) {
    if (!relay_slot()) return pf;
    pf.takeover = true;
    return pf;
  }
  pf.body_limit = cfg_.max_json_body_bytes;
  pf.limit_why = "max_json_body_bytes";
  return pf;
}

http::Headers Apiserver::NodeHeaders(const http::HttpRequest& req) const {
  http::Headers h = {{"Authorization", "Bearer " + node_token_},
                     {"X-Forwarded-For", req.remote.substr(0, req.remote.rfind(':'))}};
  // The project the node acts in (it keeps it with each sandbox and answers only for it).
  // (None for the cluster's own routes: a drain asks a node about every project.)
  const api::RouteSpec* route =
      api::MatchRoute(req.method, req.target, api::Server::kApiserver).route;
  const bool one = route && route->scope == api::Scope::kSandbox;
  const bool scoped = route && (one || route->scope == api::Scope::kCluster);
  if (auto p = ProjectOf(req, one); scoped && p.ok() && !p->empty())
    h.emplace_back("Dsec-Project", *p);
  if (std::string ct = req.Header("content-type"); !ct.empty()) h.emplace_back("Content-Type", ct);
  if (std::string k = req.Header("idempotency-key"); !k.empty())
    h.emplace_back("Idempotency-Key", k);
  return h;
}

void Apiserver::Handle(http::HttpRequest&& req, std::shared_ptr<http::Responder> res) {
  if (req.takeover_fd) {
    // Nothing blocks when the node's address is numeric (the connect finishes on the relay's
    // strand): relayed at once. A host name to resolve is resolved on a worker.
    std::vector<std::string_view> seg = SplitString(req.path, '/', true);
    auto n = seg.size() >= 3 ? view_->Find(NodeOfSandbox(seg[2])) : std::nullopt;
    in6_addr addr;
    if (!n || !n->client || inet_pton(AF_INET, n->client->host().c_str(), &addr) == 1 ||
        inet_pton(AF_INET6, n->client->host().c_str(), &addr) == 1)
      return Relay(std::move(req));
    auto shared = std::make_shared<http::HttpRequest>(std::move(req));
    boost::asio::post(workers_, [this, shared] { Relay(std::move(*shared)); });
    return;
  }
  api::RouteMatch match = api::MatchRoute(req.method, req.target, api::Server::kApiserver);
  if (match.route) Audit(req, match.params.count("id") ? match.params.at("id") : "");
  auto shared = std::make_shared<http::HttpRequest>(std::move(req));
  auto on_worker = [this, res](auto fn) {
    boost::asio::post(workers_, [fn = std::move(fn), res]() mutable {
      try {
        fn();
      } catch (const std::exception& e) {
        DSEC_LOG_ERROR("apiserver handler threw: {}", e.what());
        Fail(res, 500, "internal", "internal error");
      }
    });
  };
  if (!match.route) {
    if (!match.path_known)
      return Fail(res, 404, "not_found", "no route for " + shared->method + " " + shared->path);
    // A known path asked with a method it does not take: 405 and the methods it does take.
    std::string allow = api::AllowHeader(match.allowed);
    http::HttpResponse r = http::JsonError(
        405, "method_not_allowed",
        shared->method + " is not a method of " + shared->path + " (it takes " + allow + ")");
    r.headers.emplace_back("Allow", allow);
    return res->Send(std::move(r));
  }
  using api::RouteId;
  switch (match.route->id) {
    case RouteId::kHealth: {
      int ready = 0;
      for (const auto& n : view_->Nodes()) ready += n.State() == "ready";
      bool ok = view_->loaded();
      return Reply(res, ok ? 200 : 503,
                   {{"ok", ok}, {"etcd", view_->etcd_ok()}, {"nodes_ready", ready}});
    }
    case RouteId::kCreateSandbox:
      return on_worker([this, shared, res] { Create(*shared, res); });
    case RouteId::kListSandboxes:
      return on_worker([this, shared, res] { List(*shared, res); });
    case RouteId::kGetSandbox:
      return on_worker([this, shared, res] { GetSandbox(*shared, res); });
    case RouteId::kFnCall:
      return on_worker([this, shared, res] { FnCall(*shared, res); });
    case RouteId::kNode:
      return ClusterAsNode(res);
    case RouteId::kNodes:
      return Nodes(res);
    case RouteId::kGetNode:
      return GetNode(match.params["node"], res);
    case RouteId::kCordonNode:
    case RouteId::kUncordonNode:
    case RouteId::kDrainNode: {
      const char* action = match.route->id == RouteId::kCordonNode     ? "cordon"
                           : match.route->id == RouteId::kUncordonNode ? "uncordon"
                                                                       : "drain";
      return on_worker([this, shared, res, node = match.params["node"], action] {
        NodeAction(*shared, node, action, res);
      });
    }
    case RouteId::kPauseJob:
    case RouteId::kResumeJob:
    case RouteId::kDeleteJob:
    case RouteId::kPreemptJob:
      return on_worker([this, shared, res] { Jobs(*shared, res); });
    case RouteId::kListTrajectories:
    case RouteId::kGetTrajectory:
    case RouteId::kResumeTrajectory:
    case RouteId::kDeleteTrajectory:
      return on_worker([this, shared, res, id = match.route->id, tid = match.params["tid"]] {
        TrajectoryCall(*shared, id, tid, res);
      });
    case RouteId::kStartBuild:
    case RouteId::kListBuilds:
    case RouteId::kGetBuild:
    case RouteId::kBuildLog:
    case RouteId::kCancelBuild:
      return on_worker([this, shared, res, id = match.route->id, build = match.params["id"]] {
        BuildCall(*shared, id, build, res);
      });
    case RouteId::kListImages:
    case RouteId::kGetImage:
    case RouteId::kDeleteImage:
      return on_worker([this, shared, res, id = match.route->id, name = match.params["name"]] {
        Images(*shared, id, name, res);
      });
    case RouteId::kListProjects:
    case RouteId::kCreateProject:
    case RouteId::kGetProject:
    case RouteId::kDeleteProject:
    case RouteId::kListTokens:
    case RouteId::kCreateToken:
    case RouteId::kDeleteToken:
      return on_worker([this, shared, res, id = match.route->id, params = match.params] {
        Projects(*shared, id, params, res);
      });
    case RouteId::kGetOrgQuota:
    case RouteId::kSetOrgQuota:
    case RouteId::kGetProjectQuota:
    case RouteId::kSetProjectQuota:
    case RouteId::kReplaceProjectQuota:
    case RouteId::kGetTokenQuota:
    case RouteId::kSetTokenQuota:
      return on_worker([this, shared, res, id = match.route->id, params = match.params] {
        Quota(*shared, id, params, res);
      });
    default:
      break;
  }
  // The node's own routes (kLocal scope); a sandbox's routes were taken over in Check.
  Fail(res, 404, "not_found",
       "no route " + shared->method + " " + shared->path +
           " on the apiserver (pools and metrics are served by each edge in this release)");
}

void Apiserver::Audit(const http::HttpRequest& req, const std::string& sandbox) const {
  if (!audit_ || ((req.method == "GET" || req.method == "HEAD") && !req.websocket_upgrade)) return;
  auto who = Principal::Decode(req.principal);
  // (A signed port URL's path is its credential: logged without its MAC.)
  std::string path = req.path;
  if (api::SignedPortTarget spt; api::ParseSignedPortTarget(path, &spt))
    path = StrCat(
        {"/v1/p/", spt.id, ".", spt.port, ".", spt.expires, ".-", path.substr(spt.prefix.size())});
  Json e = {{"event", "call"},
            {"method", req.method},
            {"path", path},
            {"remote", req.remote.substr(0, req.remote.rfind(':'))}};
  if (who) {
    e["token"] = who->token;
    e["project"] = who->project;
    e["role"] = RoleName(who->role);
    if (std::string named = req.Header("dsec-project"); !named.empty()) e["acting_in"] = named;
  } else {
    e["credential"] = req.principal;  // "port": a signed port URL or port host
  }
  if (!sandbox.empty()) e["sandbox"] = sandbox;
  audit_->Record(std::move(e));
}

bool Apiserver::KeptIsCallers(const http::HttpRequest& req, const std::string& id) {
  auto p = ProjectOf(req, true);
  if (!p.ok()) return false;
  if (p->empty()) return true;  // an admin acting in any project: the node answered for all
  auto kept = records_.Get(id, WallMs());
  return !kept || kept->value("project", std::string(kDefaultProject)) == *p;
}

std::optional<Principal> Apiserver::Caller(const http::HttpRequest& req) const {
  if (CallerIsCluster(req)) return Principal{"cluster", std::string(kDefaultProject), Role::kAdmin};
  return access_->Authenticate(http::BearerToken(req), WallMs());
}

StatusOr<std::string> Apiserver::ProjectOf(const http::HttpRequest& req,
                                           bool on_one_sandbox) const {
  auto who = Principal::Decode(req.principal);
  if (!who) return PermissionDenied("no caller");  // (Check sets it on every request)
  const std::string named = req.Header("dsec-project");
  if (who->role != Role::kAdmin) return who->project;  // (Check refused naming another)
  if (!named.empty()) return named;
  return on_one_sandbox ? std::string() : std::string(kDefaultProject);
}

bool Apiserver::CallerIsCluster(const http::HttpRequest& req) const {
  const std::string token = http::BearerToken(req);
  bool ok = false;
  for (const auto& t : tokens_) ok = ok || (!token.empty() && http::ConstantTimeEquals(token, t));
  return ok;
}

void Apiserver::Relay(http::HttpRequest req) {
  UniqueFd client = std::move(req.takeover_fd);
  if (!server_)  // (between the server's start and SetServer)
    return http::SendErrorAndClose(std::move(client), 503, "unavailable", "starting");
  std::vector<std::string> seg;
  for (auto s : SplitString(req.path, '/', true)) seg.emplace_back(s);
  std::string id = seg.size() >= 3 ? seg[2] : "";
  // A port host or signed port URL (Check let it through unauthenticated): its node checks the
  // credential; it gets the node token only when the caller showed the cluster token.
  std::string port;
  api::SignedPortTarget spt;
  const bool port_host = api::ParsePortHost(req.Header("host"), cfg_.port_domain, &id, &port);
  const bool signed_port = !port_host && api::ParseSignedPortTarget(req.target, &spt);
  if (signed_port) id = spt.id;
  const bool with_node_token = !(port_host || signed_port) || CallerIsCluster(req);
  const api::RouteSpec* route =
      api::MatchRoute(req.method, req.target, api::Server::kApiserver).route;
  const bool import = route && route->id == api::RouteId::kImportImage && !port_host;
  std::optional<NodeState> n;
  std::string node;
  if (import) {
    Audit(req, "");
    auto picked = ImportNode(req);
    if (!picked.ok()) {
      auto [status, code] = api::HttpErrorFor(picked.status().code());
      return http::SendErrorAndClose(std::move(client), status, code, picked.status().message());
    }
    n = std::move(*picked);
    node = n->rec.node;
  } else {
    Audit(req, id);
    if (Status s = api::ValidateId("sandbox id", id); !s.ok())
      return http::SendErrorAndClose(std::move(client), 400, "bad_request", s.message());
    node = NodeOfSandbox(id);
    if (req.method == "DELETE" && seg.size() == 3 && KeptIsCallers(req, id)) records_.Erase(id);
    n = node.empty() ? std::nullopt : view_->Find(node);
    if (!n)
      return http::SendErrorAndClose(
          std::move(client), 404, "not_found",
          "sandbox " + id + " not found" +
              (node.empty() ? "" : " (no node " + node + " in the cluster)"));
    if (!n->alive)
      return http::SendErrorAndClose(std::move(client), 503, "unavailable", Unreachable(id, *n));
  }
  http::ProxiedRequest pr;
  if (Status s = http::FrameBody(req, &pr); !s.ok())
    return http::SendErrorAndClose(std::move(client), 400, "bad_request", s.message());
  // Keep-alive toward the node: a connection of the node's idle pool when there is one.
  auto upstream = http::ConnectUpstream(n->client, req.websocket_upgrade, &pr);
  if (!upstream.ok())
    return http::SendErrorAndClose(std::move(client), 503, "unavailable",
                                   "node " + node + ": " + upstream.status().message());
  // The node sees the call as the client made it, with the node token instead of the cluster
  // token, the client's address (not one the client claims) and the Host the client used (a
  // port host keeps it: it names the sandbox and port to the node).
  std::vector<std::pair<std::string, std::string>> extra = {
      {"X-Forwarded-For", req.remote.substr(0, req.remote.rfind(':'))},
      {"X-Forwarded-Host", req.Header("host")}};
  if (with_node_token) {
    extra.emplace_back("Authorization", "Bearer " + node_token_);
    // Only a sandbox of the caller's project answers (an admin naming none: any); an imported
    // image is the project's.
    if (auto p = ProjectOf(req, !import); p.ok() && !p->empty())
      extra.emplace_back("Dsec-Project", *p);
  }
  http::SetUpstreamHead(req, req.target,
                        port_host
                            ? req.Header("host")
                            : StrCat({n->client->host(), ":", std::to_string(n->client->port())}),
                        extra, {"x-forwarded-for", "x-forwarded-host", "dsec-project"}, &pr);
  pr.buffered = std::move(req.takeover_buffered);
  pr.target_name = "node " + node;
  // A project token's relay is registered (a dup of the client's socket) until it ends: a
  // revoke shuts the socket down, which ends the relay and its upstream call.
  std::string opener;
  uint64_t open_id = 0;
  if (auto who = Principal::Decode(req.principal);
      who && with_node_token && !CallerIsCluster(req)) {
    int dup = fcntl(client.get(), F_DUPFD_CLOEXEC, 0);
    if (dup < 0)
      return http::SendErrorAndClose(std::move(client), 503, "unavailable",
                                     "the apiserver is out of file descriptors: retry");
    opener = who->project + "/" + who->token;
    const int64_t expires = access_->TokenExpiry(who->project, who->token).value_or(0);
    MutexLock l(open_mu_);
    open_id = ++next_open_;
    open_[opener].emplace(open_id, UniqueFd(dup));
    open_expiry_[opener] = expires;
  }
  // Counted while it lasts (the relay holds the slot): past max_relays, new ones are 429.
  relays_.fetch_add(1);
  std::shared_ptr<void> slot(nullptr, [this, opener, open_id](void*) {
    relays_.fetch_sub(1);
    if (opener.empty()) return;
    MutexLock l(open_mu_);
    auto it = open_.find(opener);
    if (it == open_.end()) return;
    it->second.erase(open_id);
    if (it->second.empty()) {
      open_.erase(it);
      open_expiry_.erase(opener);
    }
  });
  // Keep-alive toward the client: after the exchange its connection comes back to this server,
  // whose next request is checked and routed afresh.
  if (req.keep_alive && !req.websocket_upgrade)
    pr.reuse = [server = server_, remote = req.remote](UniqueFd fd, std::string next) {
      server->Adopt(std::move(fd), std::move(next), remote);
    };
  http::StartPortRelay(server_->io(), std::move(client), std::move(*upstream), std::move(pr),
                       milliseconds(5000), std::move(slot), [](int) {});
}

std::string Apiserver::UnavailableWhy(const std::string& node) const {
  auto n = view_->Find(node);
  return "node " + node + " is unavailable (" + (n ? LeaseLapsed(*n) : "its lease lapsed") +
         "): this is the sandbox's last known record; calls on it answer 503 until the node is "
         "back";
}

void Apiserver::GetSandbox(const http::HttpRequest& req,
                           const std::shared_ptr<http::Responder>& res) {
  std::vector<std::string_view> seg = SplitString(req.path, '/', true);
  const std::string id(seg.size() >= 3 ? seg[2] : "");
  if (Status s = api::ValidateId("sandbox id", id); !s.ok()) return Fail(res, s);
  const std::string node = NodeOfSandbox(id);
  auto n = node.empty() ? std::nullopt : view_->Find(node);
  if (!n)
    return Fail(res, 404, "not_found",
                "sandbox " + id + " not found" +
                    (node.empty() ? "" : " (no node " + node + " in the cluster)"));
  if (!n->alive) {
    auto kept = records_.Get(id, WallMs());
    // (Another project's sandbox is not found, here as on its node.)
    if (auto p = ProjectOf(req, true);
        kept && p.ok() && !p->empty() && kept->value("project", std::string("default")) != *p)
      kept.reset();
    if (kept)
      return Reply(res, 200, RecordCache::Unavailable(std::move(*kept), UnavailableWhy(node)),
                   {{"Dsec-Node", node}});
    return Fail(res, 503, "unavailable", Unreachable(id, *n));
  }
  auto r = n->client->Request("GET", req.target, NodeHeaders(req), "",
                              milliseconds(cfg_.call_timeout_ms));
  if (!r.ok()) return Fail(res, 503, "unavailable", "node " + node + ": " + r.status().message());
  if (r->status == 200)
    records_.Put(Json::parse(r->body, nullptr, false));
  else if ((r->status == 404 || r->status == 410) && KeptIsCallers(req, id))
    records_.Erase(id);  // (another project's 404 says nothing of it)
  PassOn(res, *r, node);
}

void Apiserver::PassOnCreate(const std::shared_ptr<http::Responder>& res,
                             const http::ClientResponse& r, const std::string& node) {
  if (r.status == 200 || r.status == 201) records_.PutAll(Json::parse(r.body, nullptr, false));
  PassOn(res, r, node);
}

void Apiserver::Create(const http::HttpRequest& req, const std::shared_ptr<http::Responder>& res) {
  auto shape = api::ParseCreateShape(req.body);
  if (!shape.ok()) return Fail(res, shape.status());
  if (!shape->node.empty()) {
    auto who = Principal::Decode(req.principal);
    if (!who || who->role != Role::kAdmin)
      return Fail(res, 403, "forbidden", "only an admin may pin a create to a node (\"node\")");
  }
  // A resumed trajectory's sandbox is made on the node that keeps the trajectory.
  if (!shape->resume_trajectory.empty())
    return TrajectoryCall(req, api::RouteId::kResumeTrajectory, shape->resume_trajectory, res);
  // A new trajectory's id is the project's on every node (each node checks its own): one a node
  // keeps already is 409 wherever this create would land. (A node that does not answer cannot
  // say; the create goes on.)
  if (!shape->new_trajectory.empty()) {
    auto found = FindTrajectory(req, shape->new_trajectory,
                                "/v1/trajectories/" + shape->new_trajectory + "?limit=1");
    if (found.ok() && found->second.status == 200)
      return Fail(res, 409, "conflict",
                  "trajectory \"" + shape->new_trajectory + "\" exists (on node " +
                      found->first.rec.node + "): resume it (\"resume\": true) or take another id");
    if (!found.ok() && found.status().code() == StatusCode::kInvalidArgument)
      return Fail(res, found.status());
  }
  PlaceAndForward(req, res, std::move(*shape), /*counted=*/true);
}

void Apiserver::FnCall(const http::HttpRequest& req, const std::shared_ptr<http::Responder>& res) {
  // A call goes to a node that has the runtime (a pool of warm workers there), placed like a
  // create; the node reads the body strictly.
  Json j = Json::parse(req.body, nullptr, false);
  if (!j.is_object()) return Fail(res, 400, "bad_request", "body must be a JSON object");
  auto rt = j.find("runtime");
  if (rt == j.end() || !rt->is_string() || rt->get<std::string>().empty())
    return Fail(res, 400, "bad_request", "\"runtime\" is required");
  api::CreateShape shape;
  shape.pool = rt->get<std::string>();
  if (auto rid = j.find("request_id"); rid != j.end() && rid->is_string())
    shape.request_id = rid->get<std::string>();
  PlaceAndForward(req, res, std::move(shape), /*counted=*/false);
}

StatusOr<http::ClientResponse> Apiserver::SendCreate(const NodeState& n, const std::string& target,
                                                     const http::Headers& headers,
                                                     const std::string& body,
                                                     const api::CreateShape& shape, int64_t count,
                                                     const QuotaCaller* q) {
  const auto timeout = milliseconds(cfg_.create_timeout_ms);
  if (!q) return n.client->Request("POST", target, headers, body, timeout);
  Amount need{count, count * (shape.memory_mb > 0 ? shape.memory_mb : n.rec.default_memory_mb),
              count * (shape.cpu_milli > 0 ? shape.cpu_milli : n.rec.default_cpu_milli)};
  for (int attempt = 0;; ++attempt) {
    QuotaRefusal refusal;
    auto ticket = quotas_->Admit(q->project, q->owner, need, count, &refusal);
    if (!ticket.ok()) {
      http::ClientResponse r;
      if (ticket.status().code() == StatusCode::kOverCapacity) {
        r.status = 429;
        r.body = refusal.ToJson().dump();
        // Which quota (the SDK retries only a rate's: its room comes back next second; the
        // others' when sandboxes go, which the caller decides).
        r.headers.emplace_back("dsec-quota-exceeded", refusal.what);
        if (refusal.what == "creates_per_s") r.headers.emplace_back("retry-after", "1");
      } else {
        r.status = 503;
        r.body = http::JsonError(503, "unavailable", ticket.status().message()).body;
        r.headers.emplace_back("retry-after", "1");
      }
      r.headers.emplace_back("content-type", "application/json");
      return r;
    }
    http::Headers h = headers;
    if (!ticket->header.empty()) h.emplace_back("Dsec-Quota", ticket->header);
    auto r = n.client->Request("POST", target, h, body, timeout);
    if (!r.ok()) {
      // A connection never made sent nothing; otherwise it may have reached the node: counted
      // a while yet.
      quotas_->Settle(ticket->id, StartsWith(r.status().message(), "connect ")
                                      ? Quotas::Outcome::kFailed
                                      : Quotas::Outcome::kUnknown);
      return r;
    }
    if (r->status == 201 || r->status == 200) {
      quotas_->Settle(ticket->id, Quotas::Outcome::kCreated, n.rec.node,
                      ParseInt64(r->Header("dsec-usage-gen")).value_or(0));
      return r;
    }
    quotas_->Settle(ticket->id, Quotas::Outcome::kFailed);
    const std::string more = r->Header("dsec-quota-need");
    if (r->status != 409 || more.empty() || attempt > 0) return r;
    auto wanted = api::ParseQuotaRoom(more, /*with_hold=*/false);
    if (!wanted.ok()) return r;  // (the node's 409 as it is)
    need = Amount{wanted->sandboxes, wanted->memory_mb, wanted->cpu_milli};
  }
}

void Apiserver::PlaceAndForward(const http::HttpRequest& req,
                                const std::shared_ptr<http::Responder>& res,
                                api::CreateShape shape_value, bool counted) {
  const api::CreateShape* shape = &shape_value;
  std::optional<QuotaCaller> quota_caller;
  if (counted) {
    auto who = Principal::Decode(req.principal);
    auto project = ProjectOf(req, false);
    if (!who || !project.ok() || project->empty())
      return Fail(res, 403, "forbidden", "no caller or project for the create");
    quota_caller = QuotaCaller{*project, who->token};
  }
  const QuotaCaller* qc = quota_caller ? &*quota_caller : nullptr;
  if (!view_->etcd_ok())
    return Fail(res, 503, "unavailable",
                "the cluster store (etcd) cannot be reached: creates are refused until it is "
                "back (calls on existing sandboxes still work)");
  const auto nodes_view = view_->NodesView();
  const std::vector<NodeState>& nodes = *nodes_view;
  http::Headers headers = NodeHeaders(req);
  if (req.Header("content-type").empty()) headers.emplace_back("Content-Type", "application/json");
  if (qc) headers.emplace_back("Dsec-Owner", qc->owner);

  // 1. Placement: the candidates in order.
  PlacementOptions opts = cfg_.placement;
  const bool spread = shape->count_given && shape->count > 1;
  if (spread) {
    opts.max_tries = 1 << 20;                    // every node may take a share
    if (!shape->request_id.empty()) opts.k = 1;  // shares by rendezvous order alone
  }
  // The cluster's images it names: nodes that hold their layers cost less.
  std::vector<cluster::ClusterLayer> layers;
  if (qc)
    for (const auto& name : shape->images)
      if (auto img = view_->Image(name); img && img->project == qc->project)
        layers.insert(layers.end(), img->layers.begin(), img->layers.end());
  // (Each worker thread's own generator: creates place in parallel.)
  thread_local std::mt19937_64 rng{std::random_device{}()};
  StatusOr<std::vector<NodeState>> order = PlaceCreate(nodes, *shape, opts, &rng, layers);

  // 2. A retry of a create that an earlier attempt (through this or another apiserver) sent to
  //    a node gets that node's recorded answer (or waits for it), never a second sandbox. The
  //    first candidate needs no asking: it answers a request id it holds from its own record.
  // A client that made the request id for this very attempt (Dsec-Fresh-Request-Id: 1; the SDK
  // sends it on the first attempt of an id it generated) has no earlier attempt to find: if it
  // says so wrongly, only its own request can run twice.
  const bool fresh = req.Header("dsec-fresh-request-id") == "1";
  if (!shape->request_id.empty() && !spread && !fresh) {
    std::vector<NodeState> probes;
    for (auto& p : Probes(nodes, *shape, cfg_.placement))
      if (!order.ok() || order->empty() || p.rec.node != order->front().rec.node)
        probes.push_back(std::move(p));
    std::vector<std::future<StatusOr<http::ClientResponse>>> answers;
    http::Headers ph = headers;
    ph.emplace_back("Dsec-Replay-Only", "1");
    for (const auto& p : probes)
      answers.push_back(Fanout([&, client = p.client] {
        return client->Request("POST", req.target, ph, req.body,
                               milliseconds(cfg_.create_timeout_ms));
      }));
    for (size_t i = 0; i < answers.size(); ++i) {
      auto a = answers[i].get();
      if (a.ok() && !(a->status == 404 && ErrorOf(*a).code == "not_found")) {
        for (size_t j = i + 1; j < answers.size(); ++j) answers[j].wait();
        return PassOnCreate(res, *a, probes[i].rec.node);
      }
    }
  }
  if (!order.ok()) return Fail(res, order.status());

  if (spread && order->size() > 1) {
    // count N over up to N nodes, the first ones of the order taking one more.
    const size_t parts = std::min<size_t>(static_cast<size_t>(shape->count), order->size());
    Json body = Json::parse(req.body, nullptr, false);
    std::vector<std::future<StatusOr<http::ClientResponse>>> done;
    for (size_t i = 0; i < parts; ++i) {
      Json part = body;
      part["count"] = shape->count / static_cast<int64_t>(parts) +
                      (static_cast<int64_t>(i) < shape->count % static_cast<int64_t>(parts));
      if (!shape->request_id.empty())
        part["request_id"] = shape->request_id + "/" + std::to_string(i);
      done.push_back(
          Fanout([&, n = (*order)[i], text = part.dump(), c = part["count"].get<int64_t>()] {
            return SendCreate(n, req.target, headers, text, *shape, c, qc);
          }));
    }
    Json all = Json::array();
    std::optional<std::pair<http::ClientResponse, std::string>> failed;
    Status transport = OkStatus();
    for (size_t i = 0; i < parts; ++i) {
      auto r = done[i].get();
      if (!r.ok()) {
        transport = r.status();
      } else if (r->status != 201) {
        if (!failed) failed.emplace(*r, (*order)[i].rec.node);
      } else {
        Json j = Json::parse(r->body, nullptr, false);
        if (j.is_object() && j.contains("sandboxes") && j["sandboxes"].is_array())
          for (auto& s : j["sandboxes"]) all.push_back(std::move(s));
      }
    }
    if (!failed && transport.ok()) {
      for (const Json& r : all) records_.Put(r);
      return Reply(res, 201, {{"sandboxes", all}});
    }
    // All or nothing, as on one node: what the other nodes made goes again.
    for (const auto& s : all) {
      std::string id = s.value("id", "");
      auto n = view_->Find(NodeOfSandbox(id));
      if (n && n->alive)
        (void)n->client->Request("DELETE", "/v1/sandboxes/" + id, NodeHeaders(req), "",
                                 milliseconds(cfg_.call_timeout_ms));
    }
    if (failed) return PassOn(res, failed->first, failed->second);
    return Fail(res, 503, "unavailable", "a node did not answer its share: " + transport.message());
  }

  std::string tried;
  std::optional<std::pair<http::ClientResponse, std::string>> last;
  for (const NodeState& n : *order) {
    const int64_t mb = shape->memory_mb * shape->count;
    n.inflight->fetch_add(shape->count);
    n.inflight_mb->fetch_add(mb);
    auto r = SendCreate(n, req.target, headers, req.body, *shape, shape->count, qc);
    n.inflight->fetch_sub(shape->count);
    n.inflight_mb->fetch_sub(mb);
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kDeadlineExceeded)
        return Fail(
            res, 504, "gateway_timeout",
            "node " + n.rec.node + " did not answer the create in time: " + r.status().message());
      tried += StrCat({tried.empty() ? "" : "; ", n.rec.node, ": ", r.status().message()});
      continue;
    }
    const NodeError err = r->status >= 400 ? ErrorOf(*r) : NodeError{};
    // A quota says the same on every node.
    if (err.code == "quota_exceeded") return PassOn(res, *r, n.rec.node);
    const bool next = r->status == 429 || r->status == 503 ||
                      (r->status == 422 && err.message.find("can never fit") != std::string::npos);
    if (!next) return PassOnCreate(res, *r, n.rec.node);
    tried += StrCat({tried.empty() ? "" : "; ", n.rec.node, ": ", err.message});
    last.emplace(std::move(*r), n.rec.node);
  }
  if (last && last->first.status == 429)
    return res->Send([&] {
      http::HttpResponse out =
          http::JsonError(429, "over_capacity", "every node tried is full (" + tried + ")");
      out.headers.emplace_back("Retry-After", "1");
      return out;
    }());
  if (last) return PassOn(res, last->first, last->second);
  Fail(res, 503, "unavailable", "no node could be reached (" + tried + ")");
}

void Apiserver::List(const http::HttpRequest& req, const std::shared_ptr<http::Responder>& res) {
  int64_t limit = 100;
  std::map<std::string, std::string> at;
  std::string rest;     // the filters, passed on as given
  RecordFilter filter;  // the same, for the records kept of unavailable nodes
  if (auto p = ProjectOf(req, false); p.ok()) filter.project = *p;
  for (const auto& [k, v] : req.query) {
    if (k == "label") {
      size_t eq = v.find('=');
      if (eq != std::string::npos) filter.labels.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else if (k == "state") {
      filter.state = v;
    } else if (k == "kind") {
      filter.kind = v;
    }
    if (k == "limit") {
      auto n = ParseInt64(v);
      if (!n || *n < 1 || *n > 1000) return Fail(res, 400, "bad_request", "limit must be 1-1000");
      limit = *n;
    } else if (k == "cursor") {
      auto c = DecodeCursor(v);
      if (!c.ok()) return Fail(res, c.status());
      at = std::move(*c);
    } else {
      rest += StrCat({"&", PercentEncode(k), "=", PercentEncode(v)});
    }
  }
  struct Part {
    std::string node;
    std::future<StatusOr<http::ClientResponse>> answer;
  };
  std::vector<Part> parts;
  std::vector<std::string> unavailable;
  for (const NodeState& n : view_->Nodes()) {
    auto it = at.find(n.rec.node);
    if (it != at.end() && it->second == "~") continue;  // listed to its end
    if (!n.alive) {
      unavailable.push_back(n.rec.node);
      continue;
    }
    if (filter.state == "unavailable") continue;  // (a node that answers has none)
    std::string target = "/v1/sandboxes?limit=" + std::to_string(limit) + rest;
    if (it != at.end() && !it->second.empty()) target += "&cursor=" + PercentEncode(it->second);
    parts.push_back({n.rec.node, Fanout([this, &req, client = n.client, target] {
                       return client->Request("GET", target, NodeHeaders(req), "",
                                              milliseconds(cfg_.call_timeout_ms));
                     })});
  }
  struct Item {
    int64_t created_at;
    std::string id, node;
    Json record;
  };
  std::vector<Item> items;
  std::map<std::string, std::pair<size_t, bool>> returned;  // node -> (items, has more)
  for (auto& p : parts) {
    auto r = p.answer.get();
    if (!r.ok() || r->status != 200) {
      // A node that cannot list now fails the page: a silent gap would skip its sandboxes.
      std::string why = r.ok() ? ErrorOf(*r).message : r.status().message();
      for (auto& q : parts)
        if (q.answer.valid()) q.answer.wait();
      return Fail(res, 503, "unavailable", "node " + p.node + " did not list: " + why);
    }
    Json j = Json::parse(r->body, nullptr, false);
    if (!j.is_object() || !j.contains("sandboxes") || !j["sandboxes"].is_array())
      return Fail(res, 502, "bad_gateway", "node " + p.node + " answered a list without sandboxes");
    for (auto& s : j["sandboxes"]) {
      records_.Put(s);
      items.push_back({s.value("created_at", int64_t{0}), s.value("id", ""), p.node, std::move(s)});
    }
    returned[p.node] = {j["sandboxes"].size(),
                        j.contains("next_cursor") && j["next_cursor"].is_string()};
  }
  // An unavailable node's share: the records this apiserver last saw of its sandboxes, with
  // state "unavailable" (filtered and paged like a node's own page).
  for (const std::string& node : unavailable) {
    bool more = false;
    std::vector<Json> kept;
    if (filter.state.empty() || filter.state == "unavailable") {
      RecordFilter f = filter;
      f.state.clear();
      auto it = at.find(node);
      kept = records_.OfNode(node, it == at.end() ? "" : it->second, f, static_cast<size_t>(limit),
                             WallMs(), &more);
    }
    const std::string why = kept.empty() ? "" : UnavailableWhy(node);
    for (auto& s : kept)
      items.push_back({s.value("created_at", int64_t{0}), s.value("id", ""), node,
                       RecordCache::Unavailable(std::move(s), why)});
    returned[node] = {kept.size(), more};
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return std::tie(a.created_at, a.id) < std::tie(b.created_at, b.id);
  });
  if (items.size() > static_cast<size_t>(limit)) items.resize(static_cast<size_t>(limit));
  std::vector<std::pair<std::string, std::string>> page;
  Json out = Json::array();
  for (auto& it : items) {
    page.emplace_back(it.node, std::to_string(it.created_at) + "." + it.id);
    out.push_back(std::move(it.record));
  }
  bool more = AdvanceListCursor(page, returned, &at);
  http::Headers h;
  // Their sandboxes in the list are the records last seen here; others may exist.
  if (!unavailable.empty()) h.emplace_back("Dsec-Unavailable-Nodes", JoinStrings(unavailable, ","));
  Reply(res, 200,
        {{"sandboxes", out}, {"next_cursor", more ? Json(EncodeCursor(at)) : Json(nullptr)}},
        std::move(h));
}

StatusOr<std::pair<NodeState, http::ClientResponse>> Apiserver::FindTrajectory(
    const http::HttpRequest& req, const std::string& tid, const std::string& target) {
  DSEC_RETURN_IF_ERROR(api::ValidateId("trajectory id", tid));
  const http::Headers headers = NodeHeaders(req);
  std::vector<std::pair<NodeState, std::future<StatusOr<http::ClientResponse>>>> calls;
  std::string missing;
  for (const NodeState& n : view_->Nodes()) {
    if (!n.alive) {
      missing += StrCat({missing.empty() ? "" : "; ", n.rec.node, ": unavailable"});
      continue;
    }
    calls.emplace_back(n, Fanout([&, client = n.client] {
                         return client->Request("GET", target, headers, "",
                                                milliseconds(cfg_.call_timeout_ms));
                       }));
  }
  std::optional<std::pair<NodeState, http::ClientResponse>> best;
  int64_t best_at = -1;
  for (auto& [n, f] : calls) {
    auto r = f.get();
    if (r.ok() && r->status == 200) {
      Json j = Json::parse(r->body, nullptr, false);
      int64_t at = j.is_object() ? j.value("updated_ms", int64_t{0}) : 0;
      if (at > best_at) {
        best_at = at;
        best.emplace(n, std::move(*r));
      }
      continue;
    }
    if (r.ok() && r->status == 404) continue;
    if (r.ok() && r->status < 500) {  // the request itself (a bad branch, say): the same anywhere
      best.emplace(n, std::move(*r));
      best_at = INT64_MAX;
      continue;
    }
    missing += StrCat({missing.empty() ? "" : "; ", n.rec.node, ": ",
                       r.ok() ? ErrorOf(*r).message : r.status().message()});
  }
  if (best) return *std::move(best);
  if (!missing.empty())
    return Unavailable("trajectory \"" + tid + "\" is on no node that answered (" + missing +
                       "): retry");
  return NotFound("trajectory \"" + tid + "\" not found");
}

void Apiserver::TrajectoryCall(const http::HttpRequest& req, api::RouteId id,
                               const std::string& tid,
                               const std::shared_ptr<http::Responder>& res) {
  if (id == api::RouteId::kListTrajectories) {
    const http::Headers headers = NodeHeaders(req);
    std::vector<std::pair<std::string, std::future<StatusOr<http::ClientResponse>>>> calls;
    for (const NodeState& n : view_->Nodes())
      if (n.alive)
        calls.emplace_back(n.rec.node, Fanout([&, client = n.client] {
                             return client->Request("GET", req.target, headers, "",
                                                    milliseconds(cfg_.call_timeout_ms));
                           }));
    // (A cluster's store is listed by every node: each trajectory once, as most recently
    // updated.)
    std::map<std::string, Json> by_id;
    for (auto& [node, f] : calls) {
      auto r = f.get();
      if (!r.ok() || r->status != 200)
        return Fail(res, 503, "unavailable",
                    "node " + node + " did not list its trajectories: " +
                        (r.ok() ? ErrorOf(*r).message : r.status().message()));
      Json j = Json::parse(r->body, nullptr, false);
      if (!j.is_object() || !j.contains("trajectories") || !j["trajectories"].is_array()) continue;
      for (auto& t : j["trajectories"]) {
        if (!t.is_object() || !t.contains("id") || !t["id"].is_string()) continue;
        Json& kept = by_id[t["id"].get<std::string>()];
        if (kept.is_null() ||
            t.value("updated_ms", int64_t{0}) > kept.value("updated_ms", int64_t{0}))
          kept = std::move(t);
      }
    }
    Json all = Json::array();
    for (auto& [id, t] : by_id) all.push_back(std::move(t));
    return Reply(res, 200, {{"trajectories", std::move(all)}});
  }
  const std::string path = "/v1/trajectories/" + tid;
  auto found =
      FindTrajectory(req, tid, id == api::RouteId::kGetTrajectory ? req.target : path + "?limit=1");
  if (!found.ok()) return Fail(res, found.status());
  auto& [node, answer] = *found;
  if (id == api::RouteId::kGetTrajectory || answer.status != 200)
    return PassOn(res, answer, node.rec.node);
  http::Headers headers = NodeHeaders(req);
  if (id == api::RouteId::kDeleteTrajectory) {
    auto r = node.client->Request("DELETE", path, headers, "", milliseconds(cfg_.call_timeout_ms));
    if (!r.ok())
      return Fail(res, 503, "unavailable", "node " + node.rec.node + ": " + r.status().message());
    return PassOn(res, *r, node.rec.node);
  }
  // A resume makes a sandbox there: counted by the caller's quotas as its first one was made.
  auto who = Principal::Decode(req.principal);
  auto project = ProjectOf(req, false);
  if (!who || !project.ok() || project->empty())
    return Fail(res, 403, "forbidden", "no caller or project for the create");
  QuotaCaller qc{*project, who->token};
  headers.emplace_back("Dsec-Owner", qc.owner);
  if (req.Header("content-type").empty()) headers.emplace_back("Content-Type", "application/json");
  Json made = Json::parse(answer.body, nullptr, false);
  if (!made.is_object()) made = Json::object();
  // (A create that resumes may pin its node, an admin's; the resume route takes no shape.)
  api::CreateShape shape;
  if (auto given = api::ParseCreateShape(req.body); given.ok() && !given->node.empty()) {
    if (who->role != Role::kAdmin)
      return Fail(res, 403, "forbidden", "only an admin may pin a create to a node (\"node\")");
    shape.node = given->node;
  }
  if (made.contains("made_as") && made["made_as"].is_object()) {
    const Json& as = made["made_as"];
    shape.memory_mb = as.value("memory_mb", int64_t{0});
    shape.cpu_milli = CpuMilli(as.value("cpu", 0.0));
    shape.kind = as.value("kind", std::string("container"));
    if (std::string image = as.value("image", std::string()); !image.empty() && image != "host")
      shape.images.push_back(image);
  }
  // The sandbox that follows it is on a node that is gone: the resume takes the trajectory
  // over (the node, if it comes back, finds its sandbox lost).
  if (auto follower = made.find("sandbox"); follower != made.end() && follower->is_string()) {
    auto n = view_->Find(NodeOfSandbox(follower->get<std::string>()));
    if (!n || !n->alive)
      headers.emplace_back("Dsec-Trajectory-Takeover", follower->get<std::string>());
  }
  // A node's own log: the sandbox is made where the log is. The cluster's (every node reads
  // it): placed like any create.
  std::vector<NodeState> order;
  if (made.value("store", std::string()) == "cluster") {
    const auto nodes_view = view_->NodesView();
    std::vector<cluster::ClusterLayer> layers;
    for (const auto& name : shape.images)
      if (auto img = view_->Image(name); img && img->project == qc.project)
        layers.insert(layers.end(), img->layers.begin(), img->layers.end());
    thread_local std::mt19937_64 rng{std::random_device{}()};
    auto placed = PlaceCreate(*nodes_view, shape, cfg_.placement, &rng, layers);
    if (!placed.ok()) return Fail(res, placed.status());
    order = std::move(*placed);
  } else {
    order.push_back(node);
  }
  std::string tried;
  for (const NodeState& n : order) {
    auto r = SendCreate(n, req.target, headers, req.body, shape, 1, &qc);
    if (!r.ok()) {
      tried += StrCat({tried.empty() ? "" : "; ", n.rec.node, ": ", r.status().message()});
      continue;
    }
    return PassOnCreate(res, *r, n.rec.node);
  }
  return Fail(res, 503, "unavailable", "no node made the resumed sandbox: " + tried);
}

void Apiserver::Jobs(const http::HttpRequest& req, const std::shared_ptr<http::Responder>& res) {
  const http::Headers headers = NodeHeaders(req);  // before the calls that use it
  std::vector<std::pair<std::string, std::future<StatusOr<http::ClientResponse>>>> calls;
  std::vector<std::string> unavailable;
  for (const NodeState& n : view_->Nodes()) {
    if (!n.alive) {
      unavailable.push_back(n.rec.node);
      continue;
    }
    calls.emplace_back(n.rec.node, Fanout([&, client = n.client] {
                         return client->Request(req.method, req.target, headers, req.body,
                                                milliseconds(cfg_.call_timeout_ms));
                       }));
  }
  int64_t affected = 0;
  std::string failed;
  // A preemption's lists, from every node.
  Json lists = {
      {"checkpointed", Json::array()}, {"snapshots", Json::array()}, {"failed", Json::array()}};
  for (auto& [node, f] : calls) {
    auto r = f.get();
    if (r.ok() && r->status == 200) {
      Json j = Json::parse(r->body, nullptr, false);
      if (!j.is_object()) continue;
      affected += j.value("affected", int64_t{0});
      for (auto& [k, v] : lists.items())
        if (auto it = j.find(k); it != j.end() && it->is_array())
          for (auto& x : *it) v.push_back(std::move(x));
      continue;
    }
    if (r.ok() && r->status >= 400 && r->status < 500)  // the request itself: the same everywhere
      return PassOn(res, *r, node);
    failed += StrCat({failed.empty() ? "" : "; ", node, ": ",
                      r.ok() ? ErrorOf(*r).message : r.status().message()});
  }
  for (const auto& u : unavailable)
    failed += StrCat({failed.empty() ? "" : "; ", u, ": unavailable"});
  if (!failed.empty())
    return Fail(res, 503, "unavailable",
                "not every node took the job operation (" + failed + "); " +
                    std::to_string(affected) + " sandboxes were affected on the others: retry");
  Json out = {{"affected", affected}};
  if (req.path.ends_with("/preempt")) out.update(lists);
  Reply(res, 200, out);
}

namespace {
Json NodeJson(const NodeState& n) {
  const auto& r = n.rec;
  return {{"node", r.node},
          {"state", n.State()},
          {"url", r.url},
          {"version", r.version},
          {"instance", r.instance},
          {"backends", r.kinds},
          {"pools", r.pools},
          {"capacity",
           {{"max_sandboxes", r.max_sandboxes},
            {"memory_mb", r.memory_mb},
            {"admit_memory_mb", r.admit_memory_mb}}},
          {"usage", {{"sandboxes", r.sandboxes}, {"memory_mb", r.used_memory_mb}}},
          {"placing", n.inflight ? n.inflight->load() : 0},
          {"since", n.changed_ms}};
}
}  // namespace

StatusOr<NodeState> Apiserver::ImportNode(const http::HttpRequest& req) const {
  if (!view_->etcd_ok())
    return Unavailable("the cluster store (etcd) cannot be reached: imports wait until it is back");
  if (const std::string* named = req.Query("node"); named && !named->empty()) {
    auto who = Principal::Decode(req.principal);
    if (!who || who->role != Role::kAdmin)
      return PermissionDenied("only an admin may name the node that imports (?node=)");
    auto n = view_->Find(*named);
    if (!n) return InvalidArgument("no node " + *named + " in the cluster");
    if (!n->alive) return Unavailable("node " + *named + " is unavailable");
    return *n;
  }
  std::optional<NodeState> best;
  double best_load = 0;
  for (auto& n : view_->Nodes()) {
    if (!n.alive || !n.cordon.empty()) continue;
    const double load = static_cast<double>(n.rec.sandboxes) /
                        static_cast<double>(std::max<int64_t>(1, n.rec.max_sandboxes));
    if (!best || load < best_load) {
      best_load = load;
      best = std::move(n);
    }
  }
  if (!best) return Unavailable("no node is up and not cordoned to import the image");
  return *best;
}

void Apiserver::BuildCall(const http::HttpRequest& req, api::RouteId id, const std::string& build,
                          const std::shared_ptr<http::Responder>& res) {
  const auto timeout = milliseconds(cfg_.call_timeout_ms);
  if (id == api::RouteId::kListBuilds) {
    std::vector<std::future<StatusOr<http::ClientResponse>>> answers;
    std::vector<std::string> asked;
    for (const NodeState& n : view_->Nodes()) {
      if (!n.alive) continue;
      asked.push_back(n.rec.node);
      answers.push_back(Fanout([&, client = n.client] {
        return client->Request("GET", req.target, NodeHeaders(req), "", timeout);
      }));
    }
    Json all = Json::array();
    for (size_t i = 0; i < answers.size(); ++i) {
      auto r = answers[i].get();
      if (r.ok() && r->status == 200) {
        Json j = Json::parse(r->body, nullptr, false);
        if (j.is_object() && j.contains("builds") && j["builds"].is_array())
          for (auto& b : j["builds"]) all.push_back(std::move(b));
      } else if (r.ok() && r->status >= 400 && r->status < 500 && r->status != 409) {
        return PassOn(res, *r, asked[i]);  // (a bad filter: every node says so)
      }
    }
    std::stable_sort(all.begin(), all.end(), [](const Json& a, const Json& b) {
      return a.value("created_at", int64_t{0}) > b.value("created_at", int64_t{0});
    });
    return Reply(res, 200, {{"builds", all}});
  }
  std::optional<NodeState> n;
  if (id == api::RouteId::kStartBuild) {
    auto picked = ImportNode(req);
    if (!picked.ok()) return Fail(res, picked.status());
    n = std::move(*picked);
  } else {
    // "bld-<node>-<16 hex>"
    const size_t dash = build.rfind('-');
    const std::string node = StartsWith(build, "bld-") && dash != std::string::npos && dash > 4 &&
                                     build.size() - dash == 17
                                 ? build.substr(4, dash - 4)
                                 : "";
    n = node.empty() ? std::nullopt : view_->Find(node);
    if (!n) return Fail(res, 404, "not_found", "build " + build + " not found");
    if (!n->alive)
      return Fail(res, 503, "unavailable", "node " + node + " (the build's) is unavailable");
  }
  auto r = n->client->Request(req.method, req.target, NodeHeaders(req), req.body, timeout);
  if (!r.ok())
    return Fail(res, 503, "unavailable", "node " + n->rec.node + ": " + r.status().message());
  PassOn(res, *r, n->rec.node);
}

void Apiserver::Images(const http::HttpRequest& req, api::RouteId id, const std::string& name,
                       const std::shared_ptr<http::Responder>& res) {
  auto project = ProjectOf(req, false);
  if (!project.ok()) return Fail(res, project.status());
  // As an edge shows an image, with where the cluster has it: the node that made it and the
  // nodes that hold all of its layers now.
  const std::vector<NodeState> nodes = view_->Nodes();
  auto show = [&](const cluster::ClusterImage& img) {
    api::ImageRecord r;
    r.name = img.name;
    r.base = img.base;
    for (const auto& l : img.layers) {
      r.layers.push_back({l.digest, l.size, "erofs"});
      r.size += l.size;
    }
    auto strs = [&](const char* k) {
      std::vector<std::string> v;
      if (auto it = img.config.find(k); it != img.config.end() && it->is_array())
        for (const auto& e : *it)
          if (e.is_string()) v.push_back(e.get<std::string>());
      return v;
    };
    r.env = strs("env");
    r.entrypoint = strs("entrypoint");
    r.cmd = strs("cmd");
    r.workdir = img.config.value("workdir", "");
    r.user = img.config.value("user", "");
    r.source = img.source;
    r.created_at = img.created_at;
    Json j = api::ToJson(r);
    j["in_use"] = nullptr;  // (each node counts its own)
    j["origin"] = img.origin;
    Json held = Json::array();
    for (const auto& n : nodes)
      if (n.alive && MissingShare(n, img.layers) == 0) held.push_back(n.rec.node);
    j["nodes"] = held;
    return j;
  };
  if (id == api::RouteId::kListImages) {
    Json list = Json::array({api::HostImageJson()});
    for (const auto& img : view_->Images())
      if (img.project == *project) list.push_back(show(img));
    return Reply(res, 200, {{"images", list}});
  }
  if (name == "host" || name == "host:latest") {
    if (id == api::RouteId::kGetImage) return Reply(res, 200, api::HostImageJson());
    return Fail(res, 409, "conflict", "\"host\" is the built-in image and cannot be deleted");
  }
  auto norm = images::NormalizeName(name);
  if (!norm.ok()) return Fail(res, norm.status());
  auto img = view_->Image(*norm);
  if (!img || img->project != *project)
    return Fail(res, 404, "not_found", "image \"" + *norm + "\" not found");
  if (id == api::RouteId::kGetImage) return Reply(res, 200, show(*img));
  // DELETE: the record goes (if it is still the one shown); each node drops its copy.
  auto kv = etcd_->Get(cluster::ImageKey(*norm));
  if (!kv.ok()) return Fail(res, 503, "unavailable", "etcd: " + kv.status().message());
  auto cur = *kv ? cluster::ClusterImage::FromJson((*kv)->value)
                 : StatusOr<cluster::ClusterImage>(NotFound(""));
  if (!cur.ok() || cur->project != *project)
    return Fail(res, 404, "not_found", "image \"" + *norm + "\" not found");
  auto done =
      etcd_->Txn({{cluster::ImageKey(*norm), etcd::Client::Condition::kValueIs, (*kv)->value}}, {},
                 {cluster::ImageKey(*norm)});
  if (!done.ok()) return Fail(res, 503, "unavailable", "etcd: " + done.status().message());
  if (!*done) return Fail(res, 409, "conflict", "image \"" + *norm + "\" changed meanwhile: retry");
  http::HttpResponse r;
  r.status = 204;
  res->Send(std::move(r));
}

void Apiserver::Nodes(const std::shared_ptr<http::Responder>& res) {
  Json a = Json::array();
  for (const auto& n : view_->Nodes()) a.push_back(NodeJson(n));
  Reply(res, 200, {{"nodes", a}});
}

void Apiserver::GetNode(const std::string& node, const std::shared_ptr<http::Responder>& res) {
  auto n = view_->Find(node);
  if (!n) return Fail(res, 404, "not_found", "no node " + node + " in the cluster");
  Reply(res, 200, NodeJson(*n));
}

void Apiserver::ClusterAsNode(const std::shared_ptr<http::Responder>& res) {
  // GET /v1/node on an apiserver: the cluster as one node (what clients written for an edge
  // ask); the nodes themselves are in /v1/nodes.
  std::set<std::string> kinds;
  int64_t max_sandboxes = 0, memory_mb = 0, admit_mb = 0, sandboxes = 0, used_mb = 0;
  int ready = 0, nodes = 0;
  for (const auto& n : view_->Nodes()) {
    ++nodes;
    if (n.State() != "ready") continue;
    ++ready;
    kinds.insert(n.rec.kinds.begin(), n.rec.kinds.end());
    max_sandboxes += n.rec.max_sandboxes;
    memory_mb += n.rec.memory_mb;
    admit_mb += n.rec.admit_memory_mb;
    sandboxes += n.rec.sandboxes;
    used_mb += n.rec.used_memory_mb;
  }
  Reply(
      res, 200,
      {{"node", "cluster"},
       {"version", DSEC_VERSION},
       {"instance", "apiserver"},
       {"backends", Json(std::vector<std::string>(kinds.begin(), kinds.end()))},
       {"pools", Json::array()},
       {"capacity",
        {{"max_sandboxes", max_sandboxes},
         {"memory_mb", memory_mb},
         {"overcommit", memory_mb > 0 ? static_cast<double>(admit_mb) / memory_mb : 0.0},
         {"admit_memory_mb", admit_mb}}},
       {"usage", {{"sandboxes", sandboxes}, {"memory_mb", used_mb}, {"by_state", Json::object()}}},
       {"features",
        {{"cluster", {{"nodes", nodes}, {"nodes_ready", ready}, {"etcd", view_->etcd_ok()}}}}}});
}

void Apiserver::NodeAction(const http::HttpRequest& req, const std::string& node,
                           const std::string& action, const std::shared_ptr<http::Responder>& res) {
  auto n = view_->Find(node);
  if (!n) return Fail(res, 404, "not_found", "no node " + node + " in the cluster");
  int64_t timeout_s = 0;
  if (const std::string* t = req.Query("timeout_s")) {
    auto v = ParseInt64(*t);
    if (!v || *v < 0 || *v > 86400)
      return Fail(res, 400, "bad_request", "timeout_s must be 0-86400");
    timeout_s = *v;
  }
  const std::string key = std::string(cluster::kCordonPrefix) + node;
  Status s = action == "uncordon" ? etcd_->Delete(key) : etcd_->Put(key, action).status();
  if (!s.ok()) return Fail(res, 503, "unavailable", "etcd: " + s.message());
  if (action == "uncordon")
    view_->ApplyDelete(key);
  else
    view_->ApplyPut(key, action);
  // Drain: no new placements (above), then wait for its sandboxes to go, up to timeout_s. The
  // node itself is asked (its published load lags by up to a quarter second).
  bool drained = false;
  if (action == "drain") {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    for (;;) {
      auto cur = view_->Find(node);
      if (cur && cur->alive) {
        auto r = cur->client->Request("GET", "/v1/sandboxes?limit=1", NodeHeaders(req), "",
                                      milliseconds(cfg_.call_timeout_ms));
        Json j = r.ok() && r->status == 200 ? Json::parse(r->body, nullptr, false) : Json();
        drained = j.is_object() && j.contains("sandboxes") && j["sandboxes"].is_array() &&
                  j["sandboxes"].empty();
      }
      if (drained || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(milliseconds(200));
    }
  }
  auto cur = view_->Find(node);
  Json j = NodeJson(cur ? *cur : *n);
  if (action == "drain") j["drained"] = drained;
  Reply(res, 200, j);
}

// GET|POST /v1/projects, DELETE /v1/projects/{project}, GET|POST /v1/projects/{project}/tokens,
// DELETE /v1/projects/{project}/tokens/{name} (access.h). Check let only admins through, but to
// the list of projects (a member or viewer sees its own).
void Apiserver::Quota(const http::HttpRequest& req, api::RouteId id,
                      const std::map<std::string, std::string>& params,
                      const std::shared_ptr<http::Responder>& res) {
  auto who = Principal::Decode(req.principal);
  if (!who) return Fail(res, 403, "forbidden", "no caller");
  std::string level = "org";
  if (auto p = params.find("project"); p != params.end()) {
    const std::string& project = p->second;
    if (Status s = ValidateAccessName("project", project); !s.ok()) return Fail(res, s);
    if (!access_->ProjectExists(project) || (who->role != Role::kAdmin && project != who->project))
      return Fail(res, 404, "not_found", "no project " + project);
    level = "project/" + project;
    if (auto n = params.find("name"); n != params.end()) {
      if (Status s = ValidateAccessName("token name", n->second); !s.ok()) return Fail(res, s);
      bool known = project == kDefaultProject && n->second == "cluster";  // the cluster tokens
      for (const auto& [key, t] : access_->Tokens(project)) known = known || t.name == n->second;
      if (!known) return Fail(res, 404, "not_found", "no token " + n->second + " in " + project);
      level = StrCat({"token/", project, "/", n->second});
    }
  } else if (who->role != Role::kAdmin) {
    return Fail(res, 403, "forbidden",
                "token " + who->token + " has the " + std::string(RoleName(who->role)) +
                    " role: the organisation's quota is an admin's to see");
  }
  if (id == api::RouteId::kSetOrgQuota || id == api::RouteId::kSetProjectQuota ||
      id == api::RouteId::kReplaceProjectQuota || id == api::RouteId::kSetTokenQuota) {
    Json body = Json::parse(req.body, nullptr, false);
    // (Setting limits is idempotent by itself: a request_id, which every mutating call may
    // carry, changes nothing.)
    if (body.is_object() && body.contains("request_id") && body["request_id"].is_string())
      body.erase("request_id");
    const std::optional<QuotaLimits> old = quotas_->Limits(level);
    // PATCH changes what it names; PUT says it all.
    QuotaLimits limits =
        id == api::RouteId::kReplaceProjectQuota ? QuotaLimits{} : old.value_or(QuotaLimits{});
    if (Status s = limits.Patch(body); !s.ok()) return Fail(res, s);
    if (!limits.parent.empty()) {
      const std::string project = params.at("project");
      if (!StartsWith(level, "project/"))
        return Fail(res, 400, "bad_request", "only a project's quota has a parent");
      if (limits.parent == project || !access_->ProjectExists(limits.parent))
        return Fail(res, 400, "bad_request",
                    "\"parent\" must be another existing project, not " + limits.parent);
      // The parent's own chain must not come back to this project.
      for (const auto& l : quotas_->Chain(limits.parent, "-"))
        if (l == level)
          return Fail(res, 400, "bad_request",
                      "project " + limits.parent + " is under " + project +
                          " already: a parent there would make a cycle");
    }
    // Compare-and-set on what this view had (a change elsewhere meanwhile: 409), and a new
    // version of the level: a hold being taken on the old limits fails and looks again.
    const std::string key = StrCat({kQuotasPrefix, level});
    std::vector<etcd::Client::Condition> when = {
        old ? etcd::Client::Condition{key, etcd::Client::Condition::kValueIs, old->ToJson().dump()}
            : etcd::Client::Condition{key, etcd::Client::Condition::kAbsent, ""}};
    std::vector<etcd::Client::TxnPut> puts = {
        {StrCat({kQuotaVersionPrefix, level}), quotas_->NewVersion(), 0}};
    std::vector<std::string> deletes;
    if (!limits.empty())
      puts.push_back({key, limits.ToJson().dump(), 0});
    else
      deletes.push_back(key);
    int64_t revision = 0;
    auto ok = etcd_->TxnAt(when, puts, deletes, &revision);
    if (!ok.ok()) return Fail(res, 503, "unavailable", "etcd: " + ok.status().message());
    if (!*ok)
      return Fail(res, 409, "conflict", "the quota of " + level + " changed meanwhile: retry");
    (void)quotas_->WaitRevision(revision, 2000);
    DSEC_LOG_INFO("audit: quota set: level={} limits={} by={}:{}", level, limits.ToJson().dump(),
                  who->project, who->token);
  }
  Reply(res, 200, quotas_->Report(level));
}

void Apiserver::Projects(const http::HttpRequest& req, api::RouteId id,
                         const std::map<std::string, std::string>& params,
                         const std::shared_ptr<http::Responder>& res) {
  using api::RouteId;
  auto who = Principal::Decode(req.principal);
  if (!who) return Fail(res, 403, "forbidden", "no caller");
  const std::string project = params.count("project") ? params.at("project") : "";
  auto name_key = [](const std::string& p, const std::string& n) {
    return StrCat({kTokenNamesPrefix, p, "/", n});
  };
  if (id == RouteId::kListProjects) {
    Json list = Json::array();
    for (const auto& p : access_->Projects())
      if (who->role == Role::kAdmin || p.name == who->project) list.push_back(p.ToJson());
    return Reply(res, 200, {{"projects", list}});
  }
  if (id != RouteId::kCreateProject) {
    if (Status s = ValidateAccessName("project", project); !s.ok()) return Fail(res, s);
    // (Another project is none of a member's business: the same 404 as for none.)
    if (!access_->ProjectExists(project) || (who->role != Role::kAdmin && project != who->project))
      return Fail(res, 404, "not_found", "no project " + project);
  }
  if (id == RouteId::kGetProject) {
    for (const auto& p : access_->Projects())
      if (p.name == project) return Reply(res, 200, p.ToJson());
    return Fail(res, 404, "not_found", "no project " + project);
  }
  switch (id) {
    case RouteId::kCreateProject: {
      auto body = http::JsonBody::Parse(req.body);
      if (!body.ok()) return Fail(res, body.status());
      auto name = body->String("name", 63);
      if (!name.ok()) return Fail(res, name.status());
      if (Status s = body->Finish(); !s.ok()) return Fail(res, s);
      if (!*name) return Fail(res, 400, "bad_request", "\"name\" is required");
      if (Status s = ValidateAccessName("project", **name); !s.ok()) return Fail(res, s);
      if (**name == kDefaultProject)
        return Fail(res, 409, "conflict", "project default exists (it always does)");
      ProjectRecord rec{**name, WallMs()};
      const std::string key = std::string(kProjectsPrefix) + rec.name;
      auto made = etcd_->PutIfAbsent({{key, rec.ToJson().dump()}}, {key});
      if (!made.ok()) return Fail(res, 503, "unavailable", "etcd: " + made.status().message());
      if (!*made) return Fail(res, 409, "conflict", "project " + rec.name + " exists");
      access_->ApplyPut(key, rec.ToJson().dump());  // (the watch brings it to the others)
      DSEC_LOG_INFO("audit: project created: project={} by={}:{}", rec.name, who->project,
                    who->token);
      return Reply(res, 201, rec.ToJson());
    }
    case RouteId::kDeleteProject: {
      if (project == kDefaultProject)
        return Fail(res, 409, "conflict", "the default project cannot be removed");
      // Not while it has sandboxes: each node answers for its own (its list in that project).
      http::Headers h = {{"Authorization", "Bearer " + node_token_}, {"Dsec-Project", project}};
      for (const NodeState& n : view_->Nodes()) {
        // (A node that is away may hold some: its sandboxes would outlive their project.)
        if (!n.alive)
          return Fail(res, 503, "unavailable",
                      "node " + n.rec.node + " is unavailable: whether project " + project +
                          " has sandboxes there is not known; retry when it is back");
        auto r = n.client->Request("GET", "/v1/sandboxes?limit=1", h, "",
                                   milliseconds(cfg_.call_timeout_ms));
        if (!r.ok() || r->status != 200)
          return Fail(res, 503, "unavailable",
                      "node " + n.rec.node + " did not say whether project " + project +
                          " has sandboxes there: retry");
        Json j = Json::parse(r->body, nullptr, false);
        if (j.is_object() && j.value("sandboxes", Json::array()).size() > 0)
          return Fail(res, 409, "conflict",
                      "project " + project + " still has sandboxes (on node " + n.rec.node +
                          "): delete them first");
      }
      // The project and all its tokens in one transaction (by key range: any number of them).
      const std::vector<std::string> keys = {std::string(kProjectsPrefix) + project,
                                             StrCat({kTokensPrefix, project, "/*"}),
                                             StrCat({kTokenNamesPrefix, project, "/*"}),
                                             StrCat({kTokenUsedPrefix, project, "/*"}),
                                             StrCat({kQuotasPrefix, "project/", project}),
                                             StrCat({kQuotasPrefix, "token/", project, "/*"})};
      const auto tokens = access_->Tokens(project);
      if (Status s = etcd_->DeleteAll(keys); !s.ok())
        return Fail(res, 503, "unavailable", "etcd: " + s.message());
      access_->ApplyDelete(keys[0]);
      for (const auto& [key, t] : tokens) access_->ApplyDelete(key);
      DSEC_LOG_INFO("audit: project removed: project={} tokens={} by={}:{}", project, tokens.size(),
                    who->project, who->token);
      http::HttpResponse r;
      r.status = 204;
      return res->Send(std::move(r));
    }
    case RouteId::kListTokens: {
      Json list = Json::array();
      for (const auto& [key, t] : access_->Tokens(project)) list.push_back(t.ToJson());
      return Reply(res, 200, {{"tokens", list}});
    }
    case RouteId::kCreateToken: {
      auto body = http::JsonBody::Parse(req.body);
      if (!body.ok()) return Fail(res, body.status());
      auto name = body->String("name", 63);
      if (!name.ok()) return Fail(res, name.status());
      auto role_text = body->String("role", 16);
      if (!role_text.ok()) return Fail(res, role_text.status());
      auto ttl = body->Int("ttl_s", 1, int64_t{10} * 366 * 86400);
      if (!ttl.ok()) return Fail(res, ttl.status());
      if (Status s = body->Finish(); !s.ok()) return Fail(res, s);
      if (!*name) return Fail(res, 400, "bad_request", "\"name\" is required");
      if (Status s = ValidateAccessName("token name", **name); !s.ok()) return Fail(res, s);
      auto role = ParseRole(role_text->value_or("member"));
      if (!role.ok()) return Fail(res, role.status());
      TokenRecord rec;
      rec.name = **name;
      rec.project = project;
      rec.project_created_at = access_->ProjectCreatedAt(project).value_or(0);
      rec.role = *role;
      rec.created_at = WallMs();
      rec.expires_at = *ttl ? rec.created_at + **ttl * 1000 : 0;
      const std::string token = AccessView::NewToken();
      const std::string key = StrCat({kTokensPrefix, project, "/", access_->TokenHash(token)});
      const std::string nkey = name_key(project, rec.name);
      const std::string value = rec.ToJson().dump();
      // Only while its project exists (a removal racing it on another apiserver wins).
      std::vector<etcd::Client::Condition> when = {{nkey, etcd::Client::Condition::kAbsent, ""}};
      if (project != kDefaultProject)
        when.push_back(
            {std::string(kProjectsPrefix) + project, etcd::Client::Condition::kPresent, ""});
      auto made = etcd_->Txn(when, {{key, value}, {nkey, key}});
      if (!made.ok()) return Fail(res, 503, "unavailable", "etcd: " + made.status().message());
      if (!*made)
        return Fail(res, 409, "conflict",
                    "project " + project + " has a token named " + rec.name +
                        " (revoke it first), or was just removed");
      access_->ApplyPut(key, value);
      DSEC_LOG_INFO("audit: token created: project={} token={} role={} by={}:{}", project, rec.name,
                    RoleName(rec.role), who->project, who->token);
      Json out = rec.ToJson();
      out["token"] = token;  // shown this once: only its keyed hash is kept
      return Reply(res, 201, out, {{"Cache-Control", "no-store"}});
    }
    case RouteId::kDeleteToken: {
      const std::string name = params.count("name") ? params.at("name") : "";
      if (Status s = ValidateAccessName("token name", name); !s.ok()) return Fail(res, s);
      auto kv = etcd_->Get(name_key(project, name));
      if (!kv.ok()) return Fail(res, 503, "unavailable", "etcd: " + kv.status().message());
      if (!*kv) return Fail(res, 404, "not_found", "project " + project + " has no token " + name);
      const std::string key = (*kv)->value;
      if (!StartsWith(key, StrCat({kTokensPrefix, project, "/"})))
        return Fail(res, 500, "internal", "a bad token name record for " + name);
      // Only the token this name still names (a revoke and a new token of the same name
      // racing: the new one stays, and the revoke says to look again).
      auto gone =
          etcd_->Txn({{name_key(project, name), etcd::Client::Condition::kValueIs, key}}, {},
                     {key, name_key(project, name),
                      StrCat({kTokenUsedPrefix, project, "/", key.substr(key.rfind('/') + 1)})});
      if (!gone.ok()) return Fail(res, 503, "unavailable", "etcd: " + gone.status().message());
      if (!*gone)
        return Fail(res, 409, "conflict",
                    "token " + name + " of project " + project + " changed meanwhile: retry");
      access_->ApplyDelete(key);
      DSEC_LOG_INFO("audit: token revoked: project={} token={} by={}:{}", project, name,
                    who->project, who->token);
      http::HttpResponse r;
      r.status = 204;
      return res->Send(std::move(r));
    }
    default:
      return Fail(res, 404, "not_found", "no route");
  }
}

}  // namespace dsec::apiserver
