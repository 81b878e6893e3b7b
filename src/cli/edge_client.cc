#include "cli/edge_client.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <cstdlib>
#include <limits>

#include "base/file_util.h"
#include "base/strings.h"

namespace dsec::cli {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using Socket = asio::generic::stream_protocol::socket;

namespace {

constexpr uint64_t kMaxJsonResponse = 64ull << 20;

std::string Env(const char* name) {
  const char* v = getenv(name);
  return v ? v : "";
}

Status NetError(const Endpoint& ep, const beast::error_code& ec, std::string_view what) {
  return Unavailable(std::string(what) + " " + ep.url + ": " + ec.message());
}

}  // namespace

std::string UrlEncode(std::string_view s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

StatusOr<Endpoint> ResolveEndpoint(std::string url, std::string token, std::string project) {
  Endpoint ep;
  if (url.empty()) url = Env("DSEC_URL");
  if (token.empty()) token = Env("DSEC_TOKEN");
  ep.project = project.empty() ? Env("DSEC_PROJECT") : project;
  ep.configured = !url.empty();
  if (url.empty())
    url = access(kDefaultSocket, F_OK) == 0 ? std::string("unix://") + kDefaultSocket
                                            : std::string(kDefaultUrl);
  ep.url = url;
  if (url.starts_with("unix://") || url.starts_with("/")) {
    ep.is_unix = true;
    ep.unix_path = url.starts_with("/") ? url : url.substr(7);
    if (ep.unix_path.empty() || ep.unix_path[0] != '/' ||
        ep.unix_path.size() >= sizeof(sockaddr_un::sun_path))
      return InvalidArgument("DSEC_URL: unix socket path must be absolute and short: " + url);
  } else if (url.starts_with("http://")) {
    std::string hp = url.substr(7);
    while (!hp.empty() && hp.back() == '/') hp.pop_back();
    if (hp.find('/') != std::string::npos)
      return InvalidArgument("DSEC_URL must be http://HOST:PORT (no path): " + url);
    size_t colon = hp.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == hp.size())
      return InvalidArgument("DSEC_URL must be http://HOST:PORT: " + url);
    ep.host = hp.substr(0, colon);
    ep.port = hp.substr(colon + 1);
    if (ep.host.size() > 2 && ep.host.front() == '[' && ep.host.back() == ']')
      ep.host = ep.host.substr(1, ep.host.size() - 2);
    for (char c : ep.port)
      if (c < '0' || c > '9') return InvalidArgument("DSEC_URL: bad port in " + url);
  } else {
    return InvalidArgument("DSEC_URL must be http://HOST:PORT or unix:///PATH, not \"" + url +
                           "\"");
  }
  if (token.empty() && !ep.is_unix) {
    auto t = ReadFileToString(kDefaultTokenFile, 4096);
    if (t.ok()) {
      auto lines = SplitString(*t, '\n', true);
      if (!lines.empty()) token = std::string(TrimWhitespace(lines[0]));
    }
  }
  ep.token = token;
  return ep;
}

Status ApiError(unsigned http_status, std::string_view body) {
  std::string msg, code;
  auto j = ParseJson(body);
  if (j.ok() && j->is_object() && j->contains("error") && (*j)["error"].is_object()) {
    const Json& e = (*j)["error"];
    if (e.contains("message") && e["message"].is_string()) msg = e["message"];
    if (e.contains("code") && e["code"].is_string()) code = e["code"];
  }
  if (msg.empty()) msg = "the edge answered HTTP " + std::to_string(http_status);
  static constexpr std::pair<unsigned, StatusCode> kCodes[] = {
      {400, StatusCode::kInvalidArgument},    {401, StatusCode::kUnauthenticated},
      {403, StatusCode::kPermissionDenied},   {404, StatusCode::kNotFound},
      {409, StatusCode::kFailedPrecondition}, {413, StatusCode::kTooLarge},
      {422, StatusCode::kUnimplemented},      {429, StatusCode::kOverCapacity},
      {503, StatusCode::kUnavailable}};
  StatusCode sc = StatusCode::kInternal;
  for (auto [h, c] : kCodes)
    if (h == http_status) sc = c;
  if (http_status == 401 && code == "unauthorized")
    msg += " (set DSEC_TOKEN, or run as root to use the edge's unix socket)";
  return Status(sc, msg);
}

EdgeClient::EdgeClient(Endpoint ep) : ep_(std::move(ep)) {}
EdgeClient::~EdgeClient() { Disconnect(); }

StatusOr<Socket> EdgeClient::Dial() {
  beast::error_code ec;
  Socket s(io_);
  if (ep_.is_unix) {
    asio::local::stream_protocol::endpoint uep(ep_.unix_path);
    s.connect(asio::generic::stream_protocol::endpoint(uep), ec);
    if (ec) return NetError(ep_, ec, "cannot connect to the edge at");
    return s;
  }
  asio::ip::tcp::resolver r(io_);
  auto results = r.resolve(ep_.host, ep_.port, ec);
  if (ec) return NetError(ep_, ec, "cannot resolve");
  for (const auto& e : results) {
    if (s.is_open()) s.close(ec);
    s.connect(asio::generic::stream_protocol::endpoint(e.endpoint()), ec);
    if (!ec) {
      int one = 1;
      setsockopt(s.native_handle(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return s;
    }
  }
  return NetError(ep_, ec, "cannot connect to the edge at");
}

Status EdgeClient::EnsureConnected() {
  if (sock_) return OkStatus();
  DSEC_ASSIGN_OR_RETURN(Socket s, Dial());
  sock_.emplace(std::move(s));
  buf_.consume(buf_.size());
  reused_ = false;
  return OkStatus();
}

void EdgeClient::Disconnect() {
  if (!sock_) return;
  beast::error_code ec;
  sock_->shutdown(asio::socket_base::shutdown_both, ec);
  sock_->close(ec);
  sock_.reset();
}

namespace {

template <class Req>
void SetCommonFields(const Endpoint& ep, Req& req) {
  // With its port (RFC 9110 7.2): the edge builds URLs it answers (port URLs) from it.
  std::string host = ep.host;
  if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
  if (!ep.port.empty() && ep.port != "80") host += ":" + ep.port;
  req.set(http::field::host, ep.is_unix ? std::string("localhost") : host);
  req.set(http::field::user_agent, std::string("dsec/") + DSEC_VERSION);
  if (!ep.token.empty() && !ep.is_unix) req.set(http::field::authorization, "Bearer " + ep.token);
  if (!ep.project.empty()) req.set("Dsec-Project", ep.project);
  req.keep_alive(true);
}

// Only requests that are safe to repeat are retried on a connection the server closed: a POST
// that did reach a dying edge must not run twice.
bool Repeatable(Verb v) { return v == Verb::get || v == Verb::head || v == Verb::delete_; }

bool StaleConnection(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == asio::error::eof;
}

}  // namespace

StatusOr<unsigned> EdgeClient::Exchange(
    Verb verb, const std::string& target, std::string body, std::string_view content_type,
    const std::function<Status(unsigned, std::string_view)>& on_body) {
  http::request<http::string_body> req{verb, target, 11};
  SetCommonFields(ep_, req);
  if (!body.empty() || verb == Verb::post || verb == Verb::put || verb == Verb::patch) {
    req.set(http::field::content_type, std::string(content_type));
    req.body() = std::move(body);
    req.prepare_payload();
  }
  for (int attempt = 0;; ++attempt) {
    DSEC_RETURN_IF_ERROR(EnsureConnected());
    bool was_reused = reused_;
    beast::error_code ec;
    http::write(*sock_, req, ec);
    http::response_parser<http::buffer_body> p;
    p.body_limit(std::numeric_limits<std::uint64_t>::max());  // (boost::none is broken in 1.74)
    if (!ec) http::read_header(*sock_, buf_, p, ec);
    if (ec) {
      Disconnect();
      // A keep-alive connection the server closed while idle: nothing reached it; retry once.
      if (was_reused && attempt == 0 && StaleConnection(ec) && Repeatable(verb)) continue;
      return NetError(ep_, ec, "request to");
    }
    unsigned status = p.get().result_int();
    std::string chunk(64 << 10, '\0');
    while (!p.is_done()) {
      p.get().body().data = chunk.data();
      p.get().body().size = chunk.size();
      // read_some: whatever arrived goes to on_body now (http::read would wait until the
      // chunk is full, holding a streamed exec's output back until it ends).
      http::read_some(*sock_, buf_, p, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) {
        Disconnect();
        return NetError(ep_, ec, "reading the answer from");
      }
      std::string_view got(chunk.data(), chunk.size() - p.get().body().size);
      if (got.empty()) continue;
      if (Status s = on_body(status, got); !s.ok()) {
        Disconnect();  // the rest of the body is unread
        return s;
      }
    }
    reused_ = true;
    if (!p.get().keep_alive()) Disconnect();
    return status;
  }
}

StatusOr<EdgeClient::Response> EdgeClient::Call(Verb verb, const std::string& target,
                                                std::string body, std::string_view content_type) {
  Response r;
  DSEC_ASSIGN_OR_RETURN(r.status, Exchange(verb, target, std::move(body), content_type,
                                           [&](unsigned, std::string_view d) -> Status {
                                             if (r.body.size() + d.size() > kMaxJsonResponse)
                                               return TooLarge("the edge's answer is too large");
                                             r.body.append(d);
                                             return OkStatus();
                                           }));
  return r;
}

StatusOr<Json> EdgeClient::CallJson(Verb verb, const std::string& target, const Json* body) {
  std::string text;
  try {
    if (body) text = body->dump();
  } catch (const Json::type_error& e) {  // JSON text is UTF-8: nlohmann refuses anything else
    return InvalidArgument(std::string("cannot send text that is not UTF-8: ") + e.what());
  }
  DSEC_ASSIGN_OR_RETURN(Response r, Call(verb, target, std::move(text)));
  if (r.status < 200 || r.status >= 300) return ApiError(r.status, r.body);
  if (r.body.empty()) return Json();
  auto j = ParseJson(r.body);
  if (!j.ok()) return InternalError("the edge sent invalid JSON for " + target);
  return *j;
}

Status EdgeClient::Download(Verb verb, const std::string& target, std::string body,
                            const std::function<Status(std::string_view)>& on_data) {
  std::string error_body;
  DSEC_ASSIGN_OR_RETURN(unsigned status, Exchange(verb, target, std::move(body), "application/json",
                                                  [&](unsigned st, std::string_view d) -> Status {
                                                    if (st >= 200 && st < 300) return on_data(d);
                                                    if (error_body.size() < (1 << 20))
                                                      error_body.append(d);
                                                    return OkStatus();
                                                  }));
  return status >= 200 && status < 300 ? OkStatus() : ApiError(status, error_body);
}

Status EdgeClient::Upload(Verb verb, const std::string& target, std::string_view content_type,
                          const std::function<StatusOr<std::string>()>& next_chunk,
                          std::string* response_body) {
  // A fresh connection: a body that fails halfway leaves the connection unusable anyway.
  Disconnect();
  DSEC_RETURN_IF_ERROR(EnsureConnected());
  http::request<http::buffer_body> req{verb, target, 11};
  SetCommonFields(ep_, req);
  req.set(http::field::content_type, std::string(content_type));
  req.chunked(true);
  req.body().data = nullptr;
  req.body().more = true;
  http::request_serializer<http::buffer_body> sr{req};
  beast::error_code ec;
  http::write_header(*sock_, sr, ec);
  std::string chunk;
  bool sent_all = false;
  while (!ec) {
    auto next = next_chunk();
    if (!next.ok()) {
      Disconnect();
      return next.status();
    }
    chunk = std::move(*next);
    if (chunk.empty()) {
      req.body().data = nullptr;
      req.body().more = false;
    } else {
      req.body().data = chunk.data();
      req.body().size = chunk.size();
      req.body().more = true;
    }
    http::write(*sock_, sr, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (chunk.empty()) {
      sent_all = !ec;
      break;
    }
  }
  // Read the answer even when sending failed: the edge may have refused early (413, 404).
  http::response_parser<http::string_body> p;
  p.body_limit(kMaxJsonResponse);
  beast::error_code rec;
  http::read(*sock_, buf_, p, rec);
  if (rec) {
    Disconnect();
    return NetError(ep_, ec ? ec : rec, sent_all ? "reading the answer from" : "sending to");
  }
  auto res = p.release();
  if (!sent_all || !res.keep_alive()) Disconnect();
  reused_ = true;
  if (res.result_int() < 200 || res.result_int() >= 300)
    return ApiError(res.result_int(), res.body());
  if (!sent_all) return NetError(ep_, ec, "sending to");
  if (response_body) *response_body = std::move(res.body());
  return OkStatus();
}

StatusOr<std::unique_ptr<EdgeClient::WebSocket>> EdgeClient::OpenWebSocket(
    const std::string& target) {
  DSEC_ASSIGN_OR_RETURN(Socket s, Dial());
  auto ws = std::make_unique<WebSocket>(std::move(s));
  std::string auth = ep_.token.empty() || ep_.is_unix ? "" : "Bearer " + ep_.token;
  ws->set_option(
      beast::websocket::stream_base::decorator([auth](beast::websocket::request_type& r) {
        r.set(http::field::user_agent, std::string("dsec/") + DSEC_VERSION);
        if (!auth.empty()) r.set(http::field::authorization, auth);
      }));
  ws->read_message_max(64ull << 20);
  beast::websocket::response_type res;
  beast::error_code ec;
  ws->handshake(res, ep_.is_unix ? "localhost" : ep_.host, target, ec);
  if (ec) {
    if (res.result_int() != 0 && res.result_int() != 101)
      return ApiError(res.result_int(), res.body());
    return NetError(ep_, ec, "WebSocket handshake with");
  }
  return ws;
}

bool EdgeClient::Reachable() {
  // Bounded in time: a socket file left by a dead edge, or an edge that is stopped, must not
  // hang `dsec run` while it decides where to run.
  asio::generic::stream_protocol::endpoint target;
  beast::error_code ec;
  if (ep_.is_unix) {
    target = asio::local::stream_protocol::endpoint(ep_.unix_path);
  } else {
    asio::ip::tcp::resolver r(io_);
    auto results = r.resolve(ep_.host, ep_.port, ec);
    if (ec || results.empty()) return false;
    target = results.begin()->endpoint();
  }
  Socket s(io_);
  http::request<http::empty_body> req{Verb::get, "/v1/health", 11};
  SetCommonFields(ep_, req);
  req.keep_alive(false);
  http::response<http::string_body> res;
  beast::flat_buffer buf;
  bool ok = false;
  s.async_connect(target, [&](beast::error_code e) {
    if (e) return;
    http::async_write(s, req, [&](beast::error_code e2, size_t) {
      if (e2) return;
      http::async_read(s, buf, res,
                       [&](beast::error_code e3, size_t) { ok = !e3 && res.result_int() == 200; });
    });
  });
  io_.restart();
  io_.run_for(std::chrono::seconds(3));
  s.close(ec);  // whatever is still pending completes as aborted
  io_.restart();
  io_.run();
  return ok;
}

}  // namespace dsec::cli
