// The port proxy: /v1/sandboxes/{id}/ports/{port}/{path...} (any method) reaches a server on
// 127.0.0.1:port inside the sandbox, in every network mode (the edge connects from inside the
// sandbox's namespace). The HTTP server hands the connection over right after the request head
// (Preflight::takeover, after authentication); the head is rewritten (path, Host, no
// Authorization, framing normalised, Connection: close unless it is an upgrade) and one
// exchange is relayed (http/relay.h says what the relay guarantees: the sandbox's server never
// decides what happens to the client's connection). Nothing here blocks on the sandbox: the
// connect is started here and finished, with its deadline, on the HTTP server's I/O threads.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/ports_json.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/logging.h"
#include "base/strings.h"
#include "edge/api.h"
#include "edge/manager.h"
#include "edge/metrics.h"
#include "http/auth.h"
#include "http/relay.h"

namespace dsec::edge {

namespace {

// What a signed port URL's MAC covers: the sandbox (its id and creation time: a URL names one
// sandbox, never a later one that might reuse a name), the port and the expiry.
std::string PortUrlMessage(const std::string& id, int64_t created_at, const std::string& port,
                           const std::string& expires) {
  return StrCat(
      {"dsec-port-url\n", id, "\n", std::to_string(created_at), "\n", port, "\n", expires});
}

// A Host header's characters (a name or address and a port): what goes into a URL we answer.
bool IsHostHeader(std::string_view h) {
  if (h.empty() || h.size() > 255) return false;
  for (char c : h)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' ||
          c == '[' || c == ']'))
      return false;
  return true;
}

// POST /v1/sandboxes/{id}/port-urls {"port": N, "ttl_s": S}: a URL for the port that needs no
// token (a browser, a tool that takes only a URL), until it expires or the sandbox goes.
void CreatePortUrl(const std::shared_ptr<Ctx>& c) {
  auto run = [&]() -> StatusOr<api::PortUrl> {
    DSEC_ASSIGN_OR_RETURN(api::PortUrlRequest req, api::ParsePortUrlRequest(c->req.body));
    DSEC_ASSIGN_OR_RETURN(auto e, c->Entry());
    DSEC_ASSIGN_OR_RETURN(auto caps, c->api->deps().manager->Capabilities(e->params.kind));
    if (!caps.port_proxy) return backends::NoPortProxy(e->params.kind);
    const int64_t expires_s = WallMs() / 1000 + req.ttl_s;
    api::PortUrl out{.port = req.port,
                     .path = c->api->PortUrlPath(*e, req.port, expires_s),
                     .expires_at = expires_s * 1000};
    // The host the caller reached: an apiserver in front names it in X-Forwarded-Host (any
    // other caller holds a token too, and only shapes its own answer).
    std::string host = c->req.Header("x-forwarded-host");
    if (host.empty() || !IsHostHeader(host)) host = c->req.Header("host");
    if (!IsHostHeader(host)) host.clear();
    if (!c->req.via_unix && !host.empty()) out.url = "http://" + host + out.path;
    // The host-based form, on the port the caller reached this node by.
    const std::string& domain = c->api->deps().cfg.port_domain;
    if (std::string ph = api::PortHost(req.port, e->id, domain); !ph.empty()) {
      size_t colon = host.rfind(':');
      std::string host_port =
          colon != std::string::npos && host.find(']', colon) == std::string::npos
              ? host.substr(colon)
              : "";
      out.host_url = StrCat({"http://", ph, host_port, "/?", api::kPortTokenParam, "=",
                             c->api->PortToken(*e, req.port, expires_s)});
    }
    return out;
  };
  auto r = run();
  if (!r.ok()) return c->Fail(r.status());
  c->Reply(201, api::ToJson(*r));
}

}  // namespace

std::string Api::PortUrlPath(const SandboxEntry& e, uint16_t port, int64_t expires_s) const {
  const std::string p = std::to_string(port), x = std::to_string(expires_s);
  const std::string mac =
      HexEncode(http::HmacSha256(port_url_key_, PortUrlMessage(e.id, e.created_at(), p, x)))
          .substr(0, 32);
  return StrCat({"/v1/p/", e.id, ".", p, ".", x, ".", mac, "/"});
}

std::string Api::PortToken(const SandboxEntry& e, uint16_t port, int64_t expires_s) const {
  const std::string p = std::to_string(port), x = std::to_string(expires_s);
  return x + "." +
         HexEncode(http::HmacSha256(port_url_key_, PortUrlMessage(e.id, e.created_at(), p, x)))
             .substr(0, 32);
}

Status Api::VerifyPortHost(const http::HttpRequest& req, const std::string& id,
                           const std::string& port) const {
  const std::string bearer = http::BearerToken(req);
  for (const auto& t : d_.tokens)
    if (!bearer.empty() && http::ConstantTimeEquals(bearer, t)) return OkStatus();
  std::vector<std::string> tokens;
  std::string target = req.target, rest;
  if (auto t = api::TakePortToken(&target)) tokens.push_back(*t);
  for (auto& c : api::TakePortCookies(req.Header("cookie"), &rest)) tokens.push_back(c);
  if (tokens.empty())
    return Status(
        StatusCode::kUnauthenticated,
        "this host is port " + port + " of sandbox " + id +
            ": open a signed port URL first (POST /v1/sandboxes/{id}/port-urls, its host_url), or "
            "send the API token");
  // Any of them (a sandbox's server may have set a cookie of the same name for the domain).
  Status last = OkStatus();
  for (const auto& t : tokens) {
    api::SignedPortTarget spt{.id = id, .port = port};
    if (!api::SplitPortToken(t, &spt.expires, &spt.mac)) {
      last = PermissionDenied("this port token is not valid (not signed by this edge)");
      continue;
    }
    last = VerifyPortUrl(spt);
    if (last.ok()) return last;
  }
  return last;
}

Status Api::VerifyPortUrl(const api::SignedPortTarget& t) const {
  DSEC_RETURN_IF_ERROR(ValidateId("sandbox id", t.id));
  auto e = d_.manager->Get(t.id);
  if (!e.ok()) return e.status();
  const std::string want =
      HexEncode(http::HmacSha256(port_url_key_,
                                 PortUrlMessage(t.id, (*e)->created_at(), t.port, t.expires)))
          .substr(0, 32);
  if (!http::ConstantTimeEquals(t.mac, want))
    return PermissionDenied("this port URL is not valid (not signed by this edge)");
  auto expires = ParseInt64(t.expires);
  if (!expires || *expires * 1000 <= WallMs())
    return PermissionDenied("this port URL expired; ask for a new one");
  return OkStatus();
}

void RegisterPortRoutes(Api* a) { a->Bind(api::RouteId::kPortUrl, CreatePortUrl); }

// "/v1/sandboxes/ID/ports/PORT[/rest][?query]", or a signed "/v1/p/ID.PORT.EXPIRES.MAC[/rest]"
// (checked by Api::Authenticate): id, port and the upstream target ("/rest?query").
void ServePort(Api* api, http::HttpRequest req) {
  std::string id, port_text, target, prefix;
  std::optional<std::string> port_token;  // the host form's first visit
  std::string cookies;                    // the host form: the client's cookies but ours
  const bool port_host =
      api::ParsePortHost(req.Header("host"), api->deps().cfg.port_domain, &id, &port_text);
  if (port_host) {
    target = req.target;
    port_token = api::TakePortToken(&target);
    (void)api::TakePortCookies(req.Header("cookie"), &cookies);
  } else if (api::SignedPortTarget spt; api::ParseSignedPortTarget(req.target, &spt)) {
    id = spt.id;
    port_text = spt.port;
    target = spt.upstream;
    prefix = spt.prefix;
  } else {
    api::ParsePortTarget(req.target, &id, &port_text, &target);
    prefix = StrCat({"/v1/sandboxes/", id, "/ports/", port_text});
  }
  UniqueFd client = std::move(req.takeover_fd);
  auto fail = [&](const Status& s) {
    auto [status, code] = HttpErrorFor(s);
    if (s.code() == StatusCode::kUnavailable) status = 502, code = "bad_gateway";
    api->deps().metrics->CountRequest(req.method, status);
    http::SendErrorAndClose(std::move(client), status, code, s.message());
  };
  if (Status s = ValidateId("sandbox id", id); !s.ok()) return fail(s);
  auto port = ParseUint64(port_text);
  if (!port || *port == 0 || *port > 65535)
    return fail(InvalidArgument("port must be 1-65535, not \"" + port_text + "\""));
  // (A relayed call names its caller's project: another's sandbox is not found.)
  if (Status s = api->deps().manager->CheckProject(id, req.Header("dsec-project")); !s.ok())
    return fail(s);
  auto entry = api->deps().manager->Get(id);
  if (!entry.ok()) return fail(entry.status());
  auto caps = api->deps().manager->Capabilities((*entry)->params.kind);
  if (!caps.ok()) return fail(caps.status());
  if (!caps->port_proxy) return fail(backends::NoPortProxy((*entry)->params.kind));
  if (port_token) {
    // The first visit of a host-based URL: its token becomes a cookie of this host only (the
    // sandbox's server never sees it), and the browser comes back without it in the URL.
    api::SignedPortTarget spt{.id = id, .port = port_text};
    Status s = api::SplitPortToken(*port_token, &spt.expires, &spt.mac)
                   ? api->VerifyPortUrl(spt)
                   : PermissionDenied("this port token is not valid (not signed by this edge)");
    if (!s.ok()) return fail(s);
    const int64_t max_age = std::max<int64_t>(0, *ParseInt64(spt.expires) - WallMs() / 1000);
    http::HttpResponse r;
    r.status = 302;
    r.content_type = "text/plain; charset=utf-8";
    r.body = "Found\n";
    // Relative to this host, always: "//other.example/..." would leave it (an open redirect).
    std::string location = target;
    while (location.size() > 1 && (location[1] == '/' || location[1] == '\\')) location.erase(0, 1);
    r.headers = {{"Location", location},
                 {"Cache-Control", "no-store"},
                 {"Set-Cookie", StrCat({std::string(api::kPortCookie), "=", *port_token,
                                        "; Path=/; Max-Age=", std::to_string(max_age),
                                        "; HttpOnly; SameSite=Lax"})}};
    api->deps().metrics->CountRequest(req.method, 302);
    return http::SendAndClose(std::move(client), r);
  }
  (*entry)->Touch();
  auto sb = (*entry)->Sandbox(Op::kUse);
  if (!sb.ok()) return fail(sb.status());
  http::ProxiedRequest pr;
  if (Status s = http::FrameBody(req, &pr); !s.ok()) return fail(s);
  auto slot = api->proxy_slots().Take(id);
  if (!slot.ok()) return fail(slot.status());
  auto upstream = (*sb)->ConnectPort(static_cast<uint16_t>(*port),
                                     api->deps().cfg.port_proxy_connect_timeout_ms);
  if (!upstream.ok()) return fail(upstream.status());

  // The head as the server in the sandbox sees it.
  const std::string forwarded_for = req.remote.substr(0, req.remote.rfind(':'));
  if (port_host) {
    std::vector<std::pair<std::string, std::string>> extra = {
        {"X-Forwarded-For", forwarded_for}, {"X-Forwarded-Host", req.Header("host")}};
    if (!cookies.empty()) extra.emplace_back("Cookie", cookies);
    http::SetUpstreamHead(req, target, "localhost:" + std::to_string(*port), extra, {"cookie"},
                          &pr);
  } else {
    http::SetUpstreamHead(req, target, "localhost:" + std::to_string(*port),
                          {{"X-Forwarded-For", forwarded_for}, {"X-Forwarded-Prefix", prefix}}, {},
                          &pr);
  }
  pr.buffered = std::move(req.takeover_buffered);
  pr.target_name = "port " + port_text + " in sandbox " + id;
  Metrics* metrics = api->deps().metrics;
  http::StartPortRelay(*api->deps().proxy_io, std::move(client), std::move(*upstream),
                       std::move(pr),
                       std::chrono::milliseconds(api->deps().cfg.port_proxy_connect_timeout_ms),
                       std::move(*slot), [metrics, method = req.method](int status) {
                         if (status > 0) metrics->CountRequest(method, status);
                       });
}

}  // namespace dsec::edge
