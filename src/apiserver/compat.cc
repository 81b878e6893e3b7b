#include "apiserver/compat.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <tuple>
#include <utility>  // before asio (Boost 1.74)

#include <boost/asio/post.hpp>

#include "apiserver/apiserver.h"
#include "base/clock.h"
#include "base/json.h"
#include "base/logging.h"
#include "base/strings.h"
#include "http/auth.h"
#include "http/client.h"
#include "http/relay.h"

namespace dsec::apiserver {

namespace {

using std::chrono::milliseconds;

// E2B's error body ({"code": N, "message"}: its SDK reads the numeric code).
http::HttpResponse E2bError(int status, const std::string& message) {
  http::HttpResponse r;
  r.status = status;
  r.body = Json{{"code", status}, {"message", message}}.dump();
  return r;
}

// FastAPI's ({"detail": ...}), as SandboxFusion answers.
http::HttpResponse Detail(int status, const std::string& detail) {
  http::HttpResponse r;
  r.status = status;
  r.body = Json{{"detail", detail}}.dump();
  return r;
}

// E2B's startedAt ("2026-12-06T18:00:00.123Z") in ms since the epoch; 0 if it is not one.
int64_t ParseRfc3339Ms(const std::string& s) {
  struct tm tm {};
  const char* end = strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!end) return 0;
  int ms = 0;
  if (*end == '.') ms = atoi(end + 1);
  return static_cast<int64_t>(timegm(&tm)) * 1000 + ms;
}

}  // namespace

std::string E2bSandboxOf(const http::HttpRequest& req) {
  if (std::string id = req.Header("e2b-sandbox-id"); !id.empty()) return id;
  std::vector<std::string_view> seg = SplitString(req.path, '/', true);
  if (!seg.empty() && seg[0] == "v2") seg.erase(seg.begin());
  if (seg.size() >= 2 && seg[0] == "sandboxes") return std::string(seg[1]);
  return "";
}

CompatFront::CompatFront(Options o) : o_(std::move(o)), rng_(std::random_device{}()) {}

const char* CompatFront::name() const {
  return o_.protocol == Protocol::kE2b ? "e2b" : "sandbox-fusion";
}

const std::string& CompatFront::UrlOf(const NodeState& n) const {
  return o_.protocol == Protocol::kE2b ? n.rec.e2b_url : n.rec.sandbox_fusion_url;
}

std::string CompatFront::FusionRoute(const http::HttpRequest& req) const {
  return http::PathBehindToken(req, o_.tokens);
}

http::Preflight CompatFront::Check(http::HttpRequest& req) {
  http::Preflight pf;
  pf.principal = name();
  auto deny = [&](http::HttpResponse r) {
    pf.ok = false;
    pf.error = std::move(r);
    pf.error.close = true;
    return pf;
  };
  auto take_over = [&]() {
    if (relays_.load() >= o_.max_relays) {
      http::HttpResponse busy =
          o_.protocol == Protocol::kE2b
              ? E2bError(429, "the apiserver relays " + std::to_string(o_.max_relays) +
                                  " calls now: retry")
              : Detail(429, "the apiserver relays " + std::to_string(o_.max_relays) +
                                " calls now: retry");
      busy.headers.emplace_back("Retry-After", "1");
      return deny(std::move(busy));
    }
    pf.takeover = true;
    return pf;
  };
  if (o_.protocol == Protocol::kSandboxFusion) {
    std::string path = FusionRoute(req);
    if (path.empty())
      return deny(Detail(401,
                         "Not authenticated: a cluster token as a bearer token, or as the first "
                         "path segment (http://HOST:PORT/TOKEN/run_code)"));
    if (path == "/v1/ping") {
      pf.body_limit = 0;
      return pf;
    }
    return take_over();
  }
  // E2B: envd and the code interpreter carry the sandbox's own token, which its edge checks.
  if (!req.Header("e2b-sandbox-id").empty()) return take_over();
  const std::string key = req.Header("x-api-key");
  bool ok = false;
  for (const auto& t : o_.tokens) ok = ok || (!key.empty() && http::ConstantTimeEquals(key, t));
  if (!ok) return deny(E2bError(401, key.empty() ? "missing X-API-KEY" : "invalid X-API-KEY"));
  if (req.method == "GET" && E2bSandboxOf(req).empty()) {  // a list: answered here
    pf.body_limit = 0;
    return pf;
  }
  return take_over();
}

void CompatFront::Handle(http::HttpRequest&& req, std::shared_ptr<http::Responder> res) {
  auto shared = std::make_shared<http::HttpRequest>(std::move(req));
  if (shared->takeover_fd) {
    // A node's host name may need resolving: on a worker.
    boost::asio::post(*o_.workers, [this, shared] { Relay(std::move(*shared)); });
    return;
  }
  if (o_.protocol == Protocol::kSandboxFusion) {  // /v1/ping (Check let nothing else through)
    if (shared->method != "GET") return res->Send(Detail(405, "Method Not Allowed"));
    http::HttpResponse r;
    r.body = "\"pong\"";
    return res->Send(std::move(r));
  }
  boost::asio::post(*o_.workers, [this, shared, res] {
    try {
      E2bList(*shared, res);
    } catch (const std::exception& e) {
      DSEC_LOG_ERROR("e2b list threw: {}", e.what());
      res->Send(E2bError(500, "internal error"));
    }
  });
}

std::optional<NodeState> CompatFront::Choose() {
  std::vector<NodeState> ok;
  for (auto& n : o_.view->Nodes())
    if (n.alive && n.cordon.empty() && !UrlOf(n).empty() &&
        (n.rec.max_sandboxes <= 0 || n.rec.sandboxes < n.rec.max_sandboxes))
      ok.push_back(std::move(n));
  if (ok.empty()) return std::nullopt;
  MutexLock l(mu_);
  auto load = [&](const NodeState& n) DSEC_REQUIRES(mu_) {
    auto it = inflight_.find(n.rec.node);
    double busy = static_cast<double>(n.rec.sandboxes + (it == inflight_.end() ? 0 : it->second));
    return busy / static_cast<double>(std::max<int64_t>(1, n.rec.max_sandboxes));
  };
  // Two different nodes (when there are two), the less loaded of them.
  size_t a = std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng_);
  size_t b = a;
  if (ok.size() > 1) {
    b = std::uniform_int_distribution<size_t>(0, ok.size() - 2)(rng_);
    if (b >= a) ++b;
  }
  return load(ok[a]) <= load(ok[b]) ? ok[a] : ok[b];
}

void CompatFront::Relay(http::HttpRequest req) {
  UniqueFd client = std::move(req.takeover_fd);
  const bool e2b = o_.protocol == Protocol::kE2b;
  auto refuse = [&](int status, const std::string& message) {
    http::SendAndClose(std::move(client),
                       e2b ? E2bError(status, message) : Detail(status, message));
  };
  if (!server_) return refuse(503, "starting");
  std::optional<NodeState> n;
  std::string target = req.target;
  http::Headers extra = {{"X-Forwarded-For", req.remote.substr(0, req.remote.rfind(':'))}};
  if (e2b) {
    const std::string id = E2bSandboxOf(req);
    const bool envd = !req.Header("e2b-sandbox-id").empty();
    if (!id.empty()) {
      const std::string node = NodeOfSandbox(id);
      n = node.empty() ? std::nullopt : o_.view->Find(node);
      if (!n || UrlOf(*n).empty()) {
        // As E2B answers for a sandbox it does not know: 502 on envd's side, 404 on the API's.
        if (envd) {
          http::HttpResponse gone;
          gone.status = 502;
          gone.body =
              Json{{"sandboxId", id}, {"code", 502}, {"message", "The sandbox was not found"}}
                  .dump();
          return http::SendAndClose(std::move(client), gone);
        }
        return refuse(404, "sandbox " + id + " not found");
      }
      if (!n->alive)
        return refuse(envd ? 502 : 503, "node " + n->rec.node + " is unavailable: sandbox " + id +
                                            " cannot be reached until the node is back");
    } else {
      n = Choose();
      if (!n) return refuse(503, "no ready node runs the E2B listener");
    }
    // E2B's user (Basic "<user>:") passes on; the control plane's key becomes the node token.
    if (std::string a = req.Header("authorization"); !a.empty() && envd)
      extra.emplace_back("Authorization", a);
    if (!envd) extra.emplace_back("X-API-KEY", o_.node_token);
  } else {
    n = Choose();
    if (!n) return refuse(503, "no ready node runs the SandboxFusion listener");
    std::string path = FusionRoute(req);
    size_t q = req.target.find('?');
    target = path + (q == std::string::npos ? "" : req.target.substr(q));
    extra.emplace_back("Authorization", "Bearer " + o_.node_token);
  }
  const auto& to_node = e2b ? n->e2b_client : n->fusion_client;
  if (!to_node) return refuse(502, "node " + n->rec.node + " published a bad URL: " + UrlOf(*n));
  http::ProxiedRequest pr;
  if (Status s = http::FrameBody(req, &pr); !s.ok()) return refuse(400, s.message());
  auto upstream = http::ConnectUpstream(to_node, req.websocket_upgrade, &pr);
  if (!upstream.ok())
    return refuse(e2b ? 502 : 503, "node " + n->rec.node + ": " + upstream.status().message());
  http::SetUpstreamHead(req, target,
                        StrCat({to_node->host(), ":", std::to_string(to_node->port())}), extra,
                        {"x-forwarded-for", "x-api-key"}, &pr);
  pr.buffered = std::move(req.takeover_buffered);
  pr.target_name = "node " + n->rec.node;
  relays_.fetch_add(1);
  {
    MutexLock l(mu_);
    ++inflight_[n->rec.node];
  }
  std::shared_ptr<void> slot(nullptr, [this, node = n->rec.node](void*) {
    relays_.fetch_sub(1);
    MutexLock l(mu_);
    if (--inflight_[node] <= 0) inflight_.erase(node);
  });
  if (req.keep_alive && !req.websocket_upgrade)
    pr.reuse = [server = server_, remote = req.remote](UniqueFd fd, std::string next) {
      server->Adopt(std::move(fd), std::move(next), remote);
    };
  http::StartPortRelay(server_->io(), std::move(client), std::move(*upstream), std::move(pr),
                       milliseconds(5000), std::move(slot), [](int) {});
}

void CompatFront::E2bList(const http::HttpRequest& req,
                          const std::shared_ptr<http::Responder>& res) {
  int64_t limit = 100;
  std::map<std::string, std::string> at;
  std::string rest;  // the filters, passed on as given
  for (const auto& [k, v] : req.query) {
    if (k == "limit") {
      auto l = ParseInt64(v);
      if (!l || *l < 1 || *l > 100) return res->Send(E2bError(400, "limit must be 1-100"));
      limit = *l;
    } else if (k == "nextToken") {
      auto c = DecodeCursor(v);
      if (!c.ok()) return res->Send(E2bError(400, "bad nextToken"));
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
  const http::Headers headers = {{"X-API-KEY", o_.node_token}};
  for (const NodeState& n : o_.view->Nodes()) {
    auto it = at.find(n.rec.node);
    if ((it != at.end() && it->second == "~") || !n.alive || UrlOf(n).empty()) continue;
    std::shared_ptr<http::HttpClient> client = n.e2b_client;
    if (!client) continue;
    std::string target = "/v2/sandboxes?limit=" + std::to_string(limit) + rest;
    if (it != at.end() && !it->second.empty()) target += "&nextToken=" + PercentEncode(it->second);
    auto call = std::make_shared<std::packaged_task<StatusOr<http::ClientResponse>()>>(
        [this, client, target, headers] {
          return client->Request("GET", target, headers, "", milliseconds(o_.call_timeout_ms));
        });
    parts.push_back({n.rec.node, call->get_future()});
    boost::asio::post(fanout_, [call] { (*call)(); });
  }
  struct Item {
    std::string started, id, node;
    Json record;
  };
  std::vector<Item> items;
  std::map<std::string, std::pair<size_t, bool>> returned;  // node -> (items, has more)
  for (auto& p : parts) {
    auto r = p.answer.get();
    if (!r.ok() || r->status != 200) {
      // A node that cannot list now fails the page: a silent gap would skip its sandboxes.
      for (auto& q : parts)
        if (q.answer.valid()) q.answer.wait();
      return res->Send(E2bError(503, "node " + p.node + " did not list: " +
                                         (r.ok() ? r->body.substr(0, 200) : r.status().message())));
    }
    Json j = Json::parse(r->body, nullptr, false);
    if (!j.is_array()) return res->Send(E2bError(502, "node " + p.node + " answered a bad list"));
    for (auto& s : j)
      items.push_back({s.value("startedAt", ""), s.value("sandboxID", ""), p.node, std::move(s)});
    returned[p.node] = {j.size(), !r->Header("x-next-token").empty()};
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return std::tie(a.started, a.id) < std::tie(b.started, b.id);
  });
  if (items.size() > static_cast<size_t>(limit)) items.resize(static_cast<size_t>(limit));
  std::vector<std::pair<std::string, std::string>> page;  // the node's own cursor: "<ms>.<id>"
  Json out = Json::array();
  for (auto& it : items) {
    page.emplace_back(it.node, std::to_string(ParseRfc3339Ms(it.started)) + "." + it.id);
    out.push_back(std::move(it.record));
  }
  bool more = AdvanceListCursor(page, returned, &at);
  http::HttpResponse r;
  r.body = out.dump();
  if (more) r.headers.emplace_back("X-Next-Token", EncodeCursor(at));
  res->Send(std::move(r));
}

}  // namespace dsec::apiserver
