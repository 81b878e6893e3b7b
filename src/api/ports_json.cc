#include "api/ports_json.h"

#include <cctype>

#include "base/strings.h"
#include "http/json_body.h"

namespace dsec::api {

StatusOr<PortUrlRequest> ParsePortUrlRequest(std::string_view body) {
  DSEC_ASSIGN_OR_RETURN(http::JsonBody b, http::JsonBody::Parse(body));
  DSEC_ASSIGN_OR_RETURN(auto port, b.Int("port", 1, 65535));
  DSEC_ASSIGN_OR_RETURN(auto ttl, b.Int("ttl_s", 1, kMaxPortUrlTtlS));
  DSEC_ASSIGN_OR_RETURN(auto rid, b.String("request_id", 128));
  (void)rid;
  DSEC_RETURN_IF_ERROR(b.Finish());
  if (!port) return InvalidArgument("\"port\" is required");
  return PortUrlRequest{static_cast<uint16_t>(*port), ttl.value_or(3600)};
}

Json ToJson(const PortUrl& u) {
  return {{"port", u.port},
          {"path", u.path},
          {"expires_at", u.expires_at},
          {"url", u.url.empty() ? Json(nullptr) : Json(u.url)},
          {"host_url", u.host_url.empty() ? Json(nullptr) : Json(u.host_url)}};
}

bool IsDnsLabel(std::string_view l) {
  if (l.empty() || l.size() > 63 || l.front() == '-' || l.back() == '-') return false;
  for (char c : l)
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '-'))
      return false;
  return true;
}

Status ValidatePortDomain(std::string_view domain) {
  if (domain.empty() || domain.size() > 200)
    return InvalidArgument("must be a DNS name of 1-200 characters");
  for (std::string_view l : SplitString(domain, '.', false))
    if (!IsDnsLabel(l))
      return InvalidArgument("\"" + std::string(domain) +
                             "\" is not a lowercase DNS name (labels of a-z 0-9 -, 1-63 each)");
  return OkStatus();
}

std::string PortHost(uint16_t port, std::string_view id, std::string_view domain) {
  std::string label = std::to_string(port) + "-" + std::string(id);
  if (domain.empty() || !IsDnsLabel(label)) return "";
  return label + "." + std::string(domain);
}

bool ParsePortHost(std::string_view host, std::string_view domain, std::string* id,
                   std::string* port) {
  if (domain.empty()) return false;
  // Without the port: "name:N" (a bracketed IPv6 address is never a port host).
  if (size_t colon = host.rfind(':'); colon != std::string_view::npos) host = host.substr(0, colon);
  std::string h(host);
  for (char& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!h.empty() && h.back() == '.') h.pop_back();  // the absolute form "name."
  if (h.size() <= domain.size() + 1 || h.compare(h.size() - domain.size(), domain.size(), domain) ||
      h[h.size() - domain.size() - 1] != '.')
    return false;
  std::string_view label = std::string_view(h).substr(0, h.size() - domain.size() - 1);
  size_t dash = label.find('-');
  if (!IsDnsLabel(label) || dash == std::string_view::npos || dash == 0) return false;
  std::string_view p = label.substr(0, dash);
  for (char c : p)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  *port = std::string(p);
  *id = std::string(label.substr(dash + 1));
  return !id->empty();
}

std::optional<std::string> TakePortToken(std::string* target) {
  size_t q = target->find('?');
  if (q == std::string::npos) return std::nullopt;
  std::optional<std::string> token;
  std::string kept;
  for (std::string_view part : SplitString(std::string_view(*target).substr(q + 1), '&', true)) {
    std::string_view name = part.substr(0, part.find('='));
    if (name == kPortTokenParam) {
      size_t eq = part.find('=');
      token = std::string(eq == std::string_view::npos ? "" : part.substr(eq + 1));
      continue;
    }
    kept += (kept.empty() ? "" : "&") + std::string(part);
  }
  if (!token) return std::nullopt;
  target->resize(q);
  if (!kept.empty()) *target += "?" + kept;
  return token;
}

std::vector<std::string> TakePortCookies(std::string_view cookie_header, std::string* rest) {
  std::vector<std::string> out;
  rest->clear();
  for (std::string_view c : SplitString(cookie_header, ';', true)) {
    while (!c.empty() && c.front() == ' ') c.remove_prefix(1);
    while (!c.empty() && c.back() == ' ') c.remove_suffix(1);
    if (c.empty()) continue;
    size_t eq = c.find('=');
    if (eq != std::string_view::npos && c.substr(0, eq) == kPortCookie) {
      out.emplace_back(c.substr(eq + 1));
      continue;
    }
    *rest += (rest->empty() ? "" : "; ") + std::string(c);
  }
  return out;
}

bool SplitPortToken(std::string_view token, std::string* expires, std::string* mac) {
  size_t dot = token.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == token.size()) return false;
  *expires = std::string(token.substr(0, dot));
  *mac = std::string(token.substr(dot + 1));
  return mac->find('.') == std::string::npos;
}

}  // namespace dsec::api
