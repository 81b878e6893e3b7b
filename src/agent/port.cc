#include "agent/port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace dsec::agent {

namespace {

using protocol::FrameType;
using protocol::Json;

class PortOp : public Op, public EventHandler {
 public:
  PortOp(Agent* agent, uint32_t channel, uint16_t port) : Op(agent, channel), port_(port) {}
  ~PortOp() override { Close(); }

  void Begin() override {
    sock_.Reset(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!sock_) return Fail(ErrnoError("socket"));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port_);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(sock_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0 &&
        errno != EINPROGRESS)
      return Fail(ConnectError(errno));
    if (Status s = agent_->loop().Add(sock_.get(), EPOLLOUT, this); !s.ok()) return Fail(s);
    registered_ = true;
  }

  void OnEvent(uint32_t events) override {
    if (connecting_) {
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(sock_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err) return Fail(ConnectError(err));
      connecting_ = false;
      agent_->SendJson(FrameType::kEvent, channel_, {{"connected", true}});
      return Update();
    }
    if (events & EPOLLOUT) Flush();
    if (done_) return;
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) ReadServer();
    if (!done_) Update();
  }

  // What the edge sends to the server.
  void OnData(const protocol::Frame& f) override {
    if (f.stream() != protocol::kStdin || to_server_eof_) return;
    if (to_server_.size() + f.payload.size() > protocol::kPortWindow)
      return Fail(InvalidArgument("port relay: the edge overran its window"));
    to_server_ += f.payload;
    if (f.eof()) to_server_eof_ = true;
    if (!connecting_) {
      Flush();
      if (!done_) Update();
    }
  }

  void OnControl(const Json& j) override {
    if (auto it = j.find("ack"); it != j.end() && it->is_number_unsigned()) {
      uint64_t n = it->get<uint64_t>();
      unacked_ = n > unacked_ ? 0 : unacked_ - n;
      if (!connecting_ && !done_) Update();
    }
    if (j.contains("close")) Finish();
  }

  void OnRoom() override {
    waiting_room_ = false;
    if (!done_ && !connecting_) Update();
  }

  void Cancel() override {
    done_ = true;
    Close();
  }

 private:
  Status ConnectError(int err) {
    if (err == ECONNREFUSED)
      return Unavailable("nothing listens on port " + std::to_string(port_) + " in the sandbox");
    errno = err;
    return ErrnoError("connect to port " + std::to_string(port_));
  }

  // Reads what the server sent, as far as the window and the outgoing queue allow.
  void ReadServer() {
    char buf[protocol::kDataChunk];
    while (!from_server_eof_ && unacked_ < protocol::kPortWindow) {
      if (!agent_->OutputHasRoom()) {
        if (!waiting_room_) agent_->WaitForRoom(this);
        waiting_room_ = true;
        return;
      }
      size_t want = std::min<uint64_t>(sizeof buf, protocol::kPortWindow - unacked_);
      ssize_t n = read(sock_.get(), buf, want);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) return;
        return Fail(ErrnoError("read from port " + std::to_string(port_)));
      }
      if (n == 0) {
        from_server_eof_ = true;
        agent_->SendJson(FrameType::kEvent, channel_, {{"eof", true}});
        break;
      }
      unacked_ += static_cast<uint64_t>(n);
      agent_->Send(FrameType::kData, protocol::kStdout, channel_,
                   std::string_view(buf, static_cast<size_t>(n)));
    }
    MaybeDone();
  }

  // Writes what the edge sent to the server; acks it.
  void Flush() {
    size_t written = 0;
    while (!to_server_.empty()) {
      ssize_t n = write(sock_.get(), to_server_.data(), to_server_.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) break;
        return Fail(ErrnoError("write to port " + std::to_string(port_)));
      }
      to_server_.erase(0, static_cast<size_t>(n));
      written += static_cast<size_t>(n);
    }
    if (written) agent_->SendJson(FrameType::kEvent, channel_, {{"ack", written}});
    if (to_server_.empty() && to_server_eof_ && !shut_wr_) {
      shutdown(sock_.get(), SHUT_WR);
      shut_wr_ = true;
    }
    MaybeDone();
  }

  // Watches the socket for what the op can take now. Nothing to take: out of the loop (a
  // hung-up socket would be reported on every round even without interest).
  void Update() {
    if (!sock_) return;
    uint32_t ev = 0;
    if (!to_server_.empty()) ev |= EPOLLOUT;
    if (!from_server_eof_ && unacked_ < protocol::kPortWindow && !waiting_room_) ev |= EPOLLIN;
    if (ev == 0) {
      if (registered_) agent_->loop().Remove(sock_.get());
      registered_ = false;
    } else if (registered_) {
      agent_->loop().Modify(sock_.get(), ev, this);
    } else if (agent_->loop().Add(sock_.get(), ev, this).ok()) {
      registered_ = true;
    } else {
      Fail(InternalError("port relay: cannot watch its socket"));
    }
  }

  void MaybeDone() {
    if (from_server_eof_ && shut_wr_) Finish();
  }

  void Finish() {
    if (done_) return;
    done_ = true;
    Close();
    agent_->Finish(this, Json::object());
  }

  void Fail(const Status& s) {
    if (done_) return;
    done_ = true;
    Close();
    agent_->FinishWithError(this, s);
  }

  void Close() {
    if (registered_) agent_->loop().Remove(sock_.get());
    registered_ = false;
    sock_.Reset();
  }

  uint16_t port_;
  UniqueFd sock_;
  bool registered_ = false, connecting_ = true, done_ = false, waiting_room_ = false;
  std::string to_server_;
  bool to_server_eof_ = false, shut_wr_ = false, from_server_eof_ = false;
  uint64_t unacked_ = 0;  // sent to the edge, not yet acked
};

}  // namespace

StatusOr<Reply> HandlePortConnect(Agent* agent, uint32_t ch, protocol::PortConnectRequest req) {
  return Reply(std::make_unique<PortOp>(agent, ch, req.port));
}

}  // namespace dsec::agent
