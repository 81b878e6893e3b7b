#include "agent/loop.h"

#include <cerrno>

namespace dsec::agent {

Status Loop::Init() {
  epfd_.Reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epfd_) return ErrnoError("epoll_create1");
  return OkStatus();
}

Status Loop::Add(int fd, uint32_t events, EventHandler* h) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = h;
  if (epoll_ctl(epfd_.get(), EPOLL_CTL_ADD, fd, &ev) < 0) return ErrnoError("epoll_ctl add");
  handlers_[fd] = h;
  removed_.erase(h);  // a new handler at a freed one's address
  return OkStatus();
}

void Loop::Modify(int fd, uint32_t events, EventHandler* h) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = h;
  if (epoll_ctl(epfd_.get(), EPOLL_CTL_MOD, fd, &ev) == 0) handlers_[fd] = h;
}

void Loop::Remove(int fd) {
  epoll_ctl(epfd_.get(), EPOLL_CTL_DEL, fd, nullptr);
  if (auto it = handlers_.find(fd); it != handlers_.end()) {
    removed_.insert(it->second);
    handlers_.erase(it);
  }
}

Status Loop::RunOnce(int timeout_ms) {
  epoll_event events[64];
  int n = epoll_wait(epfd_.get(), events, 64, timeout_ms);
  if (n < 0) {
    if (errno == EINTR) return OkStatus();
    return ErrnoError("epoll_wait");
  }
  removed_.clear();
  for (int i = 0; i < n; ++i) {
    auto* h = static_cast<EventHandler*>(events[i].data.ptr);
    if (!removed_.count(h)) h->OnEvent(events[i].events);
  }
  removed_.clear();
  return OkStatus();
}

}  // namespace dsec::agent
