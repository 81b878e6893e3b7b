#include "backends/session/port_bridge.h"

#include <sys/socket.h>

#include <boost/asio.hpp>
#include <deque>
#include <future>
#include <string>

#include "protocol/agent_ops.h"

namespace dsec::backends {

namespace {

namespace asio = boost::asio;
using protocol::Json;

// Both directions of one relay. Its state lives on its strand; the agent client's callbacks
// are posted there.
class PortBridge : public AgentClient::Call, public std::enable_shared_from_this<PortBridge> {
 public:
  PortBridge(asio::io_context& io, std::shared_ptr<AgentClient> client, UniqueFd end)
      : strand_(asio::make_strand(io)), sock_(strand_), client_(std::move(client)) {
    sock_.assign(asio::local::stream_protocol(), end.Release());
  }

  // Resolves once the agent connected (OK) or failed (its error).
  std::future<Status> connected() { return connected_.get_future(); }

  void Start(uint32_t channel) {
    asio::post(strand_, [self = shared_from_this(), channel] {
      self->channel_ = channel;
      self->started_ = true;
      self->ReadEdge();
    });
  }

  void OnEvent(const Json& event) override {
    asio::post(strand_, [self = shared_from_this(), event] { self->Event(event); });
  }
  void OnData(uint8_t stream, std::string_view data) override {
    if (stream != protocol::kStdout) return;
    asio::post(strand_, [self = shared_from_this(), d = std::string(data)]() mutable {
      if (!self->sock_.is_open()) return;  // the relay ended: what comes late is dropped
      // The agent may have no more than its window unacknowledged: one that sends past it (a
      // guest's root can replace its agent) ends the relay instead of growing the edge's queue.
      self->queued_ += d.size();
      if (self->queued_ > protocol::kPortWindow + protocol::kDataChunk) {
        if (!self->ended_) self->client_->SendControl(self->channel_, {{"close", true}});
        self->CloseSocket();  // (a write in flight ends with an error and pops its buffer)
        return;
      }
      self->to_edge_.push_back(std::move(d));
      self->WriteEdge();
    });
  }
  void OnResponse(StatusOr<Json> response) override {
    asio::post(strand_, [self = shared_from_this(), st = response.status()] {
      self->ended_ = true;
      self->Resolve(st);
      if (!st.ok() || self->to_edge_.empty()) self->CloseSocket();
    });
  }

 private:
  void Resolve(const Status& s) {
    if (resolved_) return;
    resolved_ = true;
    connected_.set_value(s);
  }

  void Event(const Json& e) {
    if (e.contains("connected")) Resolve(OkStatus());
    if (auto it = e.find("ack"); it != e.end() && it->is_number_unsigned()) {
      uint64_t n = it->get<uint64_t>();
      in_flight_ = n > in_flight_ ? 0 : in_flight_ - n;
      ReadEdge();
    }
    if (e.contains("eof")) {
      agent_eof_ = true;
      WriteEdge();
    }
  }

  // The edge's side -> the agent, at most kPortWindow bytes unacknowledged.
  void ReadEdge() {
    if (!started_ || reading_ || edge_eof_ || ended_ || !sock_.is_open()) return;
    if (in_flight_ >= protocol::kPortWindow) return;
    size_t want = std::min<uint64_t>(sizeof buf_, protocol::kPortWindow - in_flight_);
    reading_ = true;
    sock_.async_read_some(asio::buffer(buf_, want), [self = shared_from_this()](
                                                        boost::system::error_code ec, size_t n) {
      self->reading_ = false;
      if (n > 0) {
        self->in_flight_ += n;
        self->client_->SendData(self->channel_, protocol::kStdin, std::string(self->buf_, n),
                                false);
      }
      if (ec) {
        self->edge_eof_ = true;  // the proxy's client is done sending (or gone)
        if (!self->ended_) self->client_->SendData(self->channel_, protocol::kStdin, "", true);
        return;
      }
      self->ReadEdge();
    });
  }

  // The agent's data -> the edge's side; each write acked when done.
  void WriteEdge() {
    if (writing_ || !sock_.is_open()) return;
    if (to_edge_.empty()) {
      if (agent_eof_ && !shut_) {
        boost::system::error_code ignored;
        sock_.shutdown(asio::socket_base::shutdown_send, ignored);
        shut_ = true;
      }
      if (ended_) CloseSocket();
      return;
    }
    writing_ = true;
    asio::async_write(sock_, asio::buffer(to_edge_.front()),
                      [self = shared_from_this()](boost::system::error_code ec, size_t n) {
                        self->writing_ = false;
                        self->queued_ -= self->to_edge_.front().size();
                        self->to_edge_.pop_front();
                        if (ec) {  // the proxy's client went away: end the relay at once
                          if (!self->ended_)
                            self->client_->SendControl(self->channel_, {{"close", true}});
                          self->CloseSocket();
                          return;
                        }
                        if (!self->ended_) self->client_->SendControl(self->channel_, {{"ack", n}});
                        self->WriteEdge();
                      });
  }

  void CloseSocket() {
    boost::system::error_code ignored;
    if (sock_.is_open()) sock_.close(ignored);
  }

  asio::strand<asio::io_context::executor_type> strand_;
  asio::local::stream_protocol::socket sock_;
  std::shared_ptr<AgentClient> client_;
  std::promise<Status> connected_;
  bool resolved_ = false, started_ = false, reading_ = false, writing_ = false;
  bool edge_eof_ = false, agent_eof_ = false, shut_ = false, ended_ = false;
  uint32_t channel_ = 0;
  uint64_t in_flight_ = 0;  // sent to the agent, not yet acked
  uint64_t queued_ = 0;     // from the agent, not yet written (nor acked)
  std::deque<std::string> to_edge_;
  char buf_[protocol::kDataChunk];
};

}  // namespace

StatusOr<UniqueFd> OpenPortRelay(asio::io_context& io, std::shared_ptr<AgentClient> client,
                                 uint16_t port, int64_t timeout_ms) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
    return ErrnoError("socketpair for the port relay");
  UniqueFd mine(sv[0]), bridge_end(sv[1]);
  auto bridge = std::make_shared<PortBridge>(io, client, std::move(bridge_end));
  std::future<Status> connected = bridge->connected();
  uint32_t channel =
      client->StartCall(protocol::Encode(protocol::PortConnectRequest{port}), bridge);
  bridge->Start(channel);
  if (connected.wait_for(std::chrono::milliseconds(timeout_ms)) != std::future_status::ready) {
    client->SendControl(channel, {{"close", true}});
    return DeadlineExceeded("the agent did not connect to port " + std::to_string(port) +
                            " within " + std::to_string(timeout_ms) + " ms");
  }
  DSEC_RETURN_IF_ERROR(connected.get());
  return mine;
}

}  // namespace dsec::backends
