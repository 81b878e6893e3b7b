// Signed port URLs as the REST API writes them (POST /v1/sandboxes/{id}/port-urls): the one
// place the request is parsed and the URL rendered. The edge's port handler
// (edge/api_ports.cc) signs the path; this layer knows no keys.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/json.h"
#include "base/status.h"

namespace dsec::api {

inline constexpr int64_t kMaxPortUrlTtlS = 30 * 86400;

// {"port": 1-65535 (required), "ttl_s": 1-30 days (default an hour)}.
struct PortUrlRequest {
  uint16_t port = 0;
  int64_t ttl_s = 3600;
};
StatusOr<PortUrlRequest> ParsePortUrlRequest(std::string_view body);

// The answer: the signed path, when it expires, the whole URL when the request came with a
// Host over TCP, and the host-based URL when the node has a port_domain (empty: null).
struct PortUrl {
  uint16_t port = 0;
  std::string path;
  int64_t expires_at = 0;  // ms since the epoch
  std::string url;
  std::string host_url;
};
Json ToJson(const PortUrl& u);

// Host-based port URLs: "<port>-<sandbox id>.<port_domain>" names a port of a sandbox as an
// origin of its own, so a web app's absolute links and cookies work as on a machine of its own.
// The first visit carries kPortTokenParam ("<expires>.<mac>", the signed URL's credential), which
// the node trades for a host-only cookie kPortCookie and a redirect to the URL without it.
inline constexpr std::string_view kPortTokenParam = "dsec_port_token";
inline constexpr std::string_view kPortCookie = "dsec_port";
// 1-63 of a-z 0-9 -, not starting or ending with '-': a DNS label (also what project and token
// names are: they show up in hosts, ids and labels).
bool IsDnsLabel(std::string_view l);
// A lowercase DNS name of labels [a-z0-9-] (1-63 characters, no '-' at either end), at most 200
// characters in all.
Status ValidatePortDomain(std::string_view domain);
// "<port>-<id>.<domain>", or "" when the id cannot be a DNS label (uppercase, '.', '_', too long).
std::string PortHost(uint16_t port, std::string_view id, std::string_view domain);
// A Host header ("<port>-<id>.<domain>[:N]", any case) split into the sandbox id and the port
// text; false for any other host (the API's own requests).
bool ParsePortHost(std::string_view host, std::string_view domain, std::string* id,
                   std::string* port);
// Takes kPortTokenParam out of a request target's query (the rest kept in order); its value.
std::optional<std::string> TakePortToken(std::string* target);
// The values of every kPortCookie in a Cookie header, and the header without them in *rest.
std::vector<std::string> TakePortCookies(std::string_view cookie_header, std::string* rest);
// "<expires>.<mac>" split; false if not of that form.
bool SplitPortToken(std::string_view token, std::string* expires, std::string* mac);

}  // namespace dsec::api
