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

#include "base/file_util.h"
#include "base/logging.h"
#include "base/strings.h"
#include "edge/api.h"
#include "edge/manager.h"
#include "edge/metrics.h"
#include "http/relay.h"

namespace dsec::edge {

namespace {}  // namespace

// "/v1/sandboxes/ID/ports/PORT[/rest][?query]": id, port and the upstream target ("/rest?query").
void ServePort(Api* api, http::HttpRequest req) {
  std::string id, port_text, target;
  api::ParsePortTarget(req.target, &id, &port_text, &target);
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
  auto entry = api->deps().manager->Get(id);
  if (!entry.ok()) return fail(entry.status());
  (*entry)->Touch();
  auto sb = (*entry)->Sandbox(Op::kUse);
  if (!sb.ok()) return fail(sb.status());
  http::ProxiedRequest pr;
  if (Status s = http::FrameBody(req, &pr); !s.ok()) return fail(s);
  auto slot = api->proxy_slots().Take(id);
  if (!slot.ok()) return fail(slot.status());
  auto upstream = (*sb)->ConnectPort(static_cast<uint16_t>(*port));
  if (!upstream.ok()) return fail(upstream.status());

  // The head as the server in the sandbox sees it.
  http::SetUpstreamHead(
      req, target, "localhost:" + std::to_string(*port),
      {{"X-Forwarded-For", req.remote.substr(0, req.remote.rfind(':'))},
       {"X-Forwarded-Prefix", StrCat({"/v1/sandboxes/", id, "/ports/", port_text})}},
      {}, &pr);
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
