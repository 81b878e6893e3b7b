// libFuzzer target for the edge's HTTP request layer: the bytes of one connection, in the
// chunks a socket might deliver, go through Beast's request parser configured as the server
// configures it (header limit; the body limit set from preflight), the edge's request-head
// conversion (RequestFromHead: method, lowercased headers, percent-decoded path and query),
// preflight (Api::Check: token auth, per-route body limits), routing (api::MatchRoute over the
// shared route table of src/api/routes.h) and the strict
// JSON body reader (JsonBody) that every handler uses. Pipelined requests are handled one after
// another, as on a keep-alive connection. The sandbox operations behind the routes are not run
// (they would create real sandboxes); the live suite (tests/security/test_api_abuse.py) fuzzes
// the handlers through a real edge.
//
// Invariants checked (a violation traps): an accepted path has no NUL; every error the edge
// would send is a JSON object with error.code and error.message; a body over the preflight
// limit is never accepted; route parameters come only from the route's pattern.
#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "edge/api.h"
#include "http/json_body.h"
#include "http/parse.h"

namespace {

namespace http = boost::beast::http;
using dsec::edge::Api;
using dsec::http::HttpRequest;
using dsec::http::HttpResponse;

constexpr const char* kToken = "fuzz-token-0123456789abcdef";

Api* TheApi() {
  static dsec::edge::Metrics metrics;
  static Api* api = [] {
    Api::Deps d;
    d.cfg.max_upload_bytes = 1 << 20;  // keep the fuzzer's bodies small
    d.cfg.max_json_body_bytes = 64 << 10;
    d.metrics = &metrics;
    d.tokens = {kToken};
    return new Api(std::move(d));
  }();
  return api;
}

void CheckError(const HttpResponse& r) {
  if (r.status < 400 || r.status > 599) __builtin_trap();
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("error") ||
      !j["error"]["code"].is_string() || !j["error"]["message"].is_string())
    __builtin_trap();
}

// What a handler does first with a JSON body: the strict reader and its typed getters.
void ReadJsonBody(const std::string& body) {
  auto b = dsec::http::JsonBody::Parse(body);
  if (!b.ok()) return;
  (void)b->String("shell");
  (void)b->StringArray("cmd", 4096, 1 << 16);
  (void)b->Int("memory_mb", 1, 1 << 20);
  (void)b->Number("cpu", 0.01, 1024);
  (void)b->Bool("background");
  (void)b->StringMap("env", 256, 256, 1 << 16);
  (void)b->StringMap("labels", 64, 63, 255, /*null_deletes=*/true);
  (void)b->Raw("network");
  (void)b->Finish();
}

// One complete request, as the server would hand it to Api::Handle.
void Route(HttpRequest& req) {
  auto m = dsec::api::MatchRoute(req.method, req.target, dsec::api::Server::kEdge);
  const dsec::api::RouteSpec* r = m.route;
  if (r && !m.path_known) __builtin_trap();
  if (r && r->scope == dsec::api::Scope::kApiserver) __builtin_trap();
  if (r && !TheApi()->HandlerOf(r->id)) __builtin_trap();
  if (!r && !m.params.empty()) __builtin_trap();
  for (const auto& [name, value] : m.params) {
    bool declared = false;
    for (const auto& seg : r->segments) declared = declared || seg == ":" + name;
    if (!declared) __builtin_trap();
    (void)dsec::api::ValidateId(name, value);
  }
  if (r && !r->upload()) ReadJsonBody(req.body);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  // The first byte picks the chunking (1..64 bytes per read) so split heads are exercised.
  size_t chunk = size ? (static_cast<uint8_t>(in[0]) % 64) + 1 : 1;
  if (!in.empty()) in.remove_prefix(1);
  const auto& cfg = TheApi()->deps().cfg;

  std::string buf;
  size_t off = 0;
  for (int requests = 0; requests < 64; ++requests) {
    http::request_parser<http::string_body> p;
    p.header_limit(static_cast<uint32_t>(cfg.max_header_bytes));
    p.body_limit((std::numeric_limits<uint64_t>::max)());
    bool head_done = false;
    uint64_t limit = 0;
    HttpRequest req;
    while (!p.is_done()) {
      boost::beast::error_code ec;
      size_t used = buf.empty() ? 0 : p.put(boost::asio::buffer(buf.data(), buf.size()), ec);
      buf.erase(0, used);
      if (ec && ec != http::error::need_more) return 0;  // 400/413 and the connection closes
      if (p.is_header_done() && !head_done) {
        head_done = true;
        HttpResponse bad;
        if (!dsec::http::RequestFromHead(p.get().base(), &req, &bad)) {
          CheckError(bad);
          return 0;
        }
        if (req.path.find('\0') != std::string::npos) __builtin_trap();
        dsec::http::Preflight pf = TheApi()->Check(req);
        if (!pf.ok) {
          CheckError(pf.error);
          return 0;
        }
        if (pf.body_limit > cfg.max_upload_bytes) __builtin_trap();
        if (auto len = p.content_length(); len && *len > pf.body_limit) return 0;  // 413
        limit = pf.body_limit;
        p.body_limit(limit);
        continue;
      }
      if (p.is_done()) break;
      if (used == 0 || ec == http::error::need_more) {
        if (off >= in.size()) return 0;  // the client stopped sending: the server times out
        buf.append(in.substr(off, chunk));
        off += chunk;
      }
    }
    req.body = std::move(p.get().body());
    if (req.body.size() > limit) __builtin_trap();
    Route(req);
    if (!p.keep_alive()) return 0;
  }
  return 0;
}
