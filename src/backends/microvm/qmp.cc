#include "backends/microvm/qmp.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/clock.h"
#include "base/fd_passing.h"

namespace dsec::backends::microvm {

namespace {
constexpr size_t kMaxMessage = 1 << 20;
}

StatusOr<QmpClient> QmpClient::Connect(const std::string& path, int timeout_ms) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return InvalidArgument("QMP socket path too long");
  memcpy(addr.sun_path, path.data(), path.size());
  int64_t deadline = MonotonicMs() + timeout_ms;
  UniqueFd fd;
  while (true) {
    fd.Reset(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) return ErrnoError("socket");
    if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) break;
    if ((errno != ENOENT && errno != ECONNREFUSED) || MonotonicMs() >= deadline)
      return ErrnoError("connect to QMP at " + path);
    usleep(2000);
  }
  QmpClient c(std::move(fd));
  DSEC_ASSIGN_OR_RETURN(Json greeting, c.ReadMessage(deadline));
  if (!greeting.is_object() || !greeting.contains("QMP"))
    return InternalError("QMP: no greeting from QEMU");
  DSEC_RETURN_IF_ERROR(
      c.Execute("qmp_capabilities", Json::object(), static_cast<int>(deadline - MonotonicMs()))
          .status());
  return c;
}

StatusOr<Json> QmpClient::ReadMessage(int64_t deadline_ms) {
  while (true) {
    size_t nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return ParseJson(line);
    }
    if (buf_.size() > kMaxMessage) return InternalError("QMP: message too long");
    int64_t left = deadline_ms - MonotonicMs();
    if (left <= 0) return DeadlineExceeded("QMP: QEMU did not answer in time");
    pollfd p{fd_.get(), POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno != EINTR) return ErrnoError("poll QMP");
    if (r <= 0) continue;
    char chunk[16384];
    ssize_t n = read(fd_.get(), chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return ErrnoError("read QMP");
    if (n == 0) return Unavailable("QMP: QEMU closed the connection");
    buf_.append(chunk, static_cast<size_t>(n));
  }
}

StatusOr<Json> QmpClient::Execute(const std::string& command, const Json& arguments, int timeout_ms,
                                  int pass_fd) {
  if (!fd_) return FailedPrecondition("QMP: not connected");
  Json req = {{"execute", command}};
  if (!arguments.empty()) req["arguments"] = arguments;
  std::string line = req.dump() + "\n";
  if (pass_fd >= 0) {
    DSEC_RETURN_IF_ERROR(SendWithFds(fd_.get(), line, {pass_fd}));
    line.clear();
  }
  for (size_t off = 0; off < line.size();) {
    ssize_t n = send(fd_.get(), line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("send to QMP");
    off += static_cast<size_t>(n);
  }
  int64_t deadline = MonotonicMs() + timeout_ms;
  while (true) {
    DSEC_ASSIGN_OR_RETURN(Json m, ReadMessage(deadline));
    if (!m.is_object() || m.contains("event")) continue;
    if (auto r = m.find("return"); r != m.end()) return *r;
    if (auto e = m.find("error"); e != m.end() && e->is_object()) {
      std::string desc = e->value("desc", std::string("unknown error"));
      return InternalError("QMP " + command + ": " + desc);
    }
    return InternalError("QMP " + command + ": unexpected reply");
  }
}

StatusOr<std::string> QmpClient::WaitStatus(const std::string& query,
                                            const std::vector<std::string>& busy, int timeout_ms) {
  int64_t deadline = MonotonicMs() + timeout_ms;
  while (true) {
    DSEC_ASSIGN_OR_RETURN(Json r, Execute(query, Json::object(), timeout_ms));
    std::string status = r.is_object() ? r.value("status", std::string()) : std::string();
    if (std::find(busy.begin(), busy.end(), status) == busy.end()) return status;
    if (MonotonicMs() >= deadline)
      return DeadlineExceeded("QMP " + query + ": still " + status + " after " +
                              std::to_string(timeout_ms) + " ms");
    usleep(1000);
  }
}

}  // namespace dsec::backends::microvm
