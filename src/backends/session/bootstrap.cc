#include "backends/session/bootstrap.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <string_view>

#include "base/clock.h"
#include "base/fd_passing.h"

namespace dsec::backends {

using protocol::Frame;
using protocol::FrameType;

namespace {

// The Status an error frame carries (`fallback` when it names none).
Status ErrorFrameStatus(const Frame& f, const std::string& fallback) {
  auto j = protocol::ParseJson(f.payload);
  Status st = j.ok() ? protocol::StatusFromJson(*j) : Status();
  return st.ok() ? InternalError(fallback) : st;
}

StatusOr<protocol::Hello> DecodeHello(const Frame& f) {
  DSEC_ASSIGN_OR_RETURN(Json j, protocol::ParseJson(f.payload));
  DSEC_ASSIGN_OR_RETURN(auto hello, protocol::DecodeAs<protocol::Hello>(j));
  DSEC_RETURN_IF_ERROR(protocol::CheckVersion(hello));
  return hello;
}

}  // namespace

AgentBootstrap::AgentBootstrap(int fd, AgentCarrier carrier)
    : fd_(fd), carrier_(std::move(carrier)), started_ms_(MonotonicMs()) {}

Status AgentBootstrap::Explain(Status raw) const {
  return carrier_.explain ? carrier_.explain(std::move(raw)) : raw;
}

StatusOr<Frame> AgentBootstrap::Next(int64_t deadline_ms) {
  const int64_t asked_at = MonotonicMs();
  Frame f;
  char buf[16 * 1024];
  while (!dec_.Next(&f)) {
    if (dec_.failed()) return InternalError(carrier_.name + " sent a malformed frame");
    int64_t left = deadline_ms - MonotonicMs();
    if (left <= 0)
      return Explain(DeadlineExceeded(carrier_.name + " did not answer within " +
                                      std::to_string(std::max<int64_t>(0, deadline_ms - asked_at)) +
                                      " ms"));
    pollfd p[2] = {{fd_, POLLIN, 0}, {carrier_.exit_fd, POLLIN, 0}};
    int r = poll(p, carrier_.exit_fd >= 0 ? 2 : 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r < 0 && errno != EINTR) return ErrnoError("poll " + carrier_.name);
    if (r <= 0) continue;
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n < 0 && errno != ECONNRESET) return ErrnoError("recv from " + carrier_.name);
      if (n > 0) {
        DSEC_RETURN_IF_ERROR(dec_.Feed(std::string_view(buf, static_cast<size_t>(n))));
        continue;
      }
    }
    // The connection ended, or the carrier did.
    return Explain(Unavailable(carrier_.name + " hung up during setup"));
  }
  return f;
}

StatusOr<protocol::Hello> AgentBootstrap::ExpectHello(int64_t deadline_ms) {
  DSEC_ASSIGN_OR_RETURN(Frame f, Next(deadline_ms));
  if (f.type == FrameType::kError)  // before its hello: it could not start (a guest's init)
    return Unavailable(carrier_.name +
                       " failed to start: " + ErrorFrameStatus(f, "no reason given").message());
  if (f.type != FrameType::kHello) return InternalError(carrier_.name + " did not say hello");
  return DecodeHello(f);
}

Status AgentBootstrap::SendSetup(const Json& setup, const std::vector<int>& fds) {
  std::string frame;
  DSEC_RETURN_IF_ERROR(protocol::EncodeFrame(FrameType::kSetup, 0, 0, setup.dump(), &frame));
  return SendWithFds(fd_, frame, fds).WithContext("send setup to " + carrier_.name);
}

StatusOr<protocol::Ready> AgentBootstrap::ExpectReady(int64_t deadline_ms) {
  DSEC_ASSIGN_OR_RETURN(Frame f, Next(deadline_ms));
  if (f.type == FrameType::kError) return ErrorFrameStatus(f, carrier_.name + "'s setup failed");
  if (f.type != FrameType::kReady)
    return InternalError(carrier_.name + " sent an unexpected frame during setup");
  DSEC_ASSIGN_OR_RETURN(Json j, protocol::ParseJson(f.payload));
  return protocol::DecodeAs<protocol::Ready>(j);
}

StatusOr<protocol::Hello> Reauthenticate(int fd, const std::string& secret, int64_t deadline_ms) {
  return Reauthenticate(fd, protocol::Auth{secret, std::nullopt}, deadline_ms);
}

StatusOr<protocol::Hello> Reauthenticate(int fd, const protocol::Auth& a, int64_t deadline_ms) {
  std::string auth;
  DSEC_RETURN_IF_ERROR(
      protocol::EncodeFrame(FrameType::kAuth, 0, 0, protocol::Encode(a).dump(), &auth));
  DSEC_RETURN_IF_ERROR(SendWithFds(fd, auth, {}).WithContext("send auth to the agent"));
  // Resync: try a frame at every magic in what arrived. Replies are small; stale output is
  // skipped, whatever it holds.
  const std::string_view magic("DS", 2);
  std::string buf;
  size_t scanned = 0;  // magics before this offset were tried with everything after them
  while (buf.size() < (1u << 20)) {
    for (size_t at = buf.find(magic, scanned); at != std::string::npos;
         at = buf.find(magic, at + 1)) {
      protocol::FrameDecoder dec(4096);
      Frame f;
      if (!dec.Feed(std::string_view(buf).substr(at)).ok() || !dec.Next(&f)) continue;
      auto j = protocol::ParseJson(f.payload);
      if (!j.ok()) continue;
      if (f.type == FrameType::kError) {
        Status st = protocol::StatusFromJson(*j);
        return st.ok() ? Status(StatusCode::kUnauthenticated, "the agent refused the secret") : st;
      }
      if (f.type != FrameType::kHello) continue;
      if (auto hello = protocol::DecodeAs<protocol::Hello>(*j); hello.ok()) {
        DSEC_RETURN_IF_ERROR(protocol::CheckVersion(*hello));
        return hello;
      }
    }
    // A magic with a whole bounded frame's worth of bytes after it has had its chance.
    constexpr size_t kMaxReply = 4096 + protocol::kHeaderSize;
    scanned = buf.size() > kMaxReply ? buf.size() - kMaxReply : 0;
    int64_t left = deadline_ms - MonotonicMs();
    if (left <= 0) return DeadlineExceeded("the agent did not answer the reconnect");
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000))) <= 0) continue;
    char chunk[16 * 1024];
    ssize_t n = recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno == ECONNRESET))
      return Unavailable("the agent hung up on the reconnect");
    if (n < 0 && errno != EAGAIN && errno != EINTR) return ErrnoError("recv from the agent");
    if (n > 0) buf.append(chunk, static_cast<size_t>(n));
  }
  return InternalError("no hello from the agent in 1 MiB");
}

}  // namespace dsec::backends
