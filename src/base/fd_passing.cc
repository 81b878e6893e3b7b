#include "base/fd_passing.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>

namespace dsec {

Status SendWithFds(int sock, std::string_view bytes, const std::vector<int>& fds) {
  size_t off = 0;
  bool first = true;
  while (off < bytes.size() || (first && !fds.empty())) {
    char dummy = 0;
    iovec io = off < bytes.size() ? iovec{const_cast<char*>(bytes.data() + off), bytes.size() - off}
                                  : iovec{&dummy, 1};
    msghdr m{};
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    std::vector<char> cm;
    if (first && !fds.empty()) {
      cm.resize(CMSG_SPACE(sizeof(int) * fds.size()));
      m.msg_control = cm.data();
      m.msg_controllen = cm.size();
      cmsghdr* h = CMSG_FIRSTHDR(&m);
      h->cmsg_level = SOL_SOCKET;
      h->cmsg_type = SCM_RIGHTS;
      h->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      memcpy(CMSG_DATA(h), fds.data(), sizeof(int) * fds.size());
    }
    ssize_t n = sendmsg(sock, &m, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("sendmsg");
    first = false;
    if (io.iov_base == &dummy) break;
    off += static_cast<size_t>(n);
  }
  return OkStatus();
}

StatusOr<size_t> RecvWithFds(int sock, size_t max_bytes, size_t max_fds, std::string* bytes,
                             std::vector<UniqueFd>* fds) {
  bytes->resize(max_bytes);
  // Room for what the caller takes (SCM_MAX_FD is 253), at least one so extras are seen.
  std::vector<char> cm(CMSG_SPACE(sizeof(int) * std::clamp<size_t>(max_fds, 1, 253)));
  iovec io{bytes->data(), bytes->size()};
  msghdr m{};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  m.msg_control = cm.data();
  m.msg_controllen = cm.size();
  ssize_t n;
  do {
    n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    bytes->clear();
    return ErrnoError("recvmsg");
  }
  bytes->resize(static_cast<size_t>(n));
  for (cmsghdr* h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
    if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
      UniqueFd owned(fd);
      if (fds->size() < max_fds) fds->push_back(std::move(owned));
    }
  }
  if (m.msg_flags & MSG_CTRUNC) return InvalidArgument("too many fds passed");
  return static_cast<size_t>(n);
}

}  // namespace dsec
