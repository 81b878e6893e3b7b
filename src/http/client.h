// A small blocking HTTP/1.1 client for the cluster's own calls: the edge and the apiserver to
// etcd's JSON gateway, the apiserver to the edges. One HttpClient talks to one host:port and
// keeps a pool of idle keep-alive connections. Every call has a deadline (connect, send and
// receive together); nothing ever blocks without one. A call on a reused connection that the
// server had closed while it was idle (nothing of a response came back) is sent once more on a
// fresh connection, as browsers do; any other failure is returned.
//
// Bodies: Request reads the whole response (bounded by max_body); Stream hands the body to a
// callback as it arrives (etcd's watch, long responses), with an idle deadline between bytes.
//
// Thread safety: all methods are thread-safe; calls run in parallel on separate connections.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct ClientResponse {
  int status = 0;
  Headers headers;  // names lowercased
  std::string body;
  std::string Header(std::string_view lowercase_name) const;
};

// A TCP socket (non-blocking, TCP_NODELAY) whose connect to host:port has been started: done,
// or EINPROGRESS (wait for POLLOUT, then SO_ERROR). `skip` passes over the resolver's first
// addresses; *more says whether another follows. A host name is resolved here (blocking).
StatusOr<UniqueFd> StartConnect(const std::string& host, uint16_t port, size_t skip = 0,
                                bool* more = nullptr);

// "http://host:port[/...]" -> host and port (80 when absent). Only plain http.
Status ParseHttpUrl(std::string_view url, std::string* host, uint16_t* port);

class HttpClient {
 public:
  HttpClient(std::string host, uint16_t port, size_t max_idle = 32);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Unavailable on connect/transport failures, DeadlineExceeded past `timeout`, TooLarge when
  // the body is over max_body. An HTTP error status is a response, not an error.
  StatusOr<ClientResponse> Request(std::string_view method, std::string_view target,
                                   const Headers& headers, std::string_view body,
                                   std::chrono::milliseconds timeout, uint64_t max_body = 64 << 20);

  // Sends the request, then calls on_head with the status and headers and on_data with every
  // piece of the body as it arrives, until the body ends (OK), on_data returns false or *stop
  // turns true (Aborted), or nothing arrives for `idle` (DeadlineExceeded). The connection is
  // not reused.
  Status Stream(std::string_view method, std::string_view target, const Headers& headers,
                std::string_view body, std::chrono::milliseconds connect_timeout,
                std::chrono::milliseconds idle, const std::atomic<bool>* stop,
                const std::function<void(int status, const Headers& headers)>& on_head,
                const std::function<bool(std::string_view data)>& on_data);

  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }

  // The idle pool, for relays that speak HTTP on these connections themselves (the
  // apiserver's relayed exchanges): an idle keep-alive connection (non-blocking, between
  // messages, not seen closed by the server), or an invalid fd when there is none. A
  // connection given back must be between messages in both directions.
  UniqueFd TakeIdle();
  void GiveBack(UniqueFd fd);

 private:
  StatusOr<UniqueFd> Connect(std::chrono::steady_clock::time_point deadline);

  std::string host_;
  uint16_t port_;
  size_t max_idle_;
  Mutex mu_;
  std::vector<UniqueFd> idle_ DSEC_GUARDED_BY(mu_);
};

}  // namespace dsec::http
