// What the HTTP layer makes of a request head: percent-decoding, the query, headers, and the
// JSON error body every refusal uses.
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <nlohmann/json.hpp>

#include "base/strings.h"
#include "http/parse.h"
#include "http/server.h"

namespace dsec::http {

namespace http = boost::beast::http;
namespace websocket = boost::beast::websocket;

HttpResponse JsonError(int status, std::string_view code, std::string_view message) {
  HttpResponse r;
  r.status = status;
  r.body = nlohmann::json({{"error", {{"code", code}, {"message", message}}}})
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out) {
  auto hex = [](char h) -> int {
    if (h >= '0' && h <= '9') return h - '0';
    if (h >= 'a' && h <= 'f') return h - 'a' + 10;
    if (h >= 'A' && h <= 'F') return h - 'A' + 10;
    return -1;
  };
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      int hi = hex(in[i + 1]), lo = hex(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      *out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      *out += (c == '+' && plus_is_space) ? ' ' : c;
    }
  }
  return true;
}

bool DecodeTarget(HttpRequest* req, HttpResponse* error) {
  std::string_view target = req->target;
  size_t q = target.find('?');
  if (!PercentDecode(target.substr(0, q), false, &req->path) ||
      req->path.find('\0') != std::string::npos) {
    *error = JsonError(400, "bad_request", "bad percent-encoding in the path");
    return false;
  }
  if (q != std::string_view::npos) {
    std::string_view qs = target.substr(q + 1);
    while (!qs.empty()) {
      size_t amp = qs.find('&');
      std::string_view part = qs.substr(0, amp);
      qs = amp == std::string_view::npos ? std::string_view() : qs.substr(amp + 1);
      if (part.empty()) continue;
      size_t eq = part.find('=');
      std::string k, v;
      if (!PercentDecode(part.substr(0, eq), true, &k) ||
          (eq != std::string_view::npos && !PercentDecode(part.substr(eq + 1), true, &v))) {
        *error = JsonError(400, "bad_request", "bad percent-encoding in the query");
        return false;
      }
      req->query.emplace_back(std::move(k), std::move(v));
    }
  }
  return true;
}

bool RequestFromHead(const http::request_header<>& h, HttpRequest* req, HttpResponse* error) {
  req->method = std::string(h.method_string());
  req->target = std::string(h.target());
  for (const auto& f : h) {
    std::string name(f.name_string());
    for (auto& c : name) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
    req->headers.emplace_back(std::move(name), std::string(f.value()));
  }
  if (!DecodeTarget(req, error)) return false;
  req->websocket_upgrade = websocket::is_upgrade(h);
  {
    bool close = false, keep = false;
    for (auto token : http::token_list{h[http::field::connection]}) {
      close = close || boost::beast::iequals(token, "close");
      keep = keep || boost::beast::iequals(token, "keep-alive");
    }
    req->keep_alive = h.version() >= 11 ? !close : keep;
  }
  return true;
}

const std::string* HttpRequest::Query(std::string_view name) const {
  for (const auto& [k, v] : query)
    if (k == name) return &v;
  return nullptr;
}

std::vector<std::string> HttpRequest::QueryAll(std::string_view name) const {
  std::vector<std::string> out;
  for (const auto& [k, v] : query)
    if (k == name) out.push_back(v);
  return out;
}

std::string HttpRequest::Header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return {};
}

Status ParseHostPort(const std::string& s, std::string* host, uint16_t* port) {
  size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return InvalidArgument("listen address \"" + s + "\" must be HOST:PORT");
  std::string h = s.substr(0, colon);
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  auto p = ParseInt64(s.substr(colon + 1));
  if (!p || *p < 0 || *p > 65535) return InvalidArgument("bad port in \"" + s + "\"");
  *host = h;
  *port = static_cast<uint16_t>(*p);
  return OkStatus();
}

}  // namespace dsec::http
