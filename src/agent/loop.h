// A small epoll loop for the single-threaded agent. Handlers are owned elsewhere; a handler
// that goes away must Remove() itself first. Deadlines are kept by their owners and queried
// through NextDeadline so the loop sleeps exactly until the earliest one.
#pragma once

#include <sys/epoll.h>

#include <cstdint>
#include <functional>

#include <unordered_map>
#include <unordered_set>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::agent {

class EventHandler {
 public:
  virtual ~EventHandler() = default;
  virtual void OnEvent(uint32_t events) = 0;
};

class Loop {
 public:
  Status Init();
  Status Add(int fd, uint32_t events, EventHandler* h);
  // Best effort: fails only for an fd that is not registered, which Add() reported.
  void Modify(int fd, uint32_t events, EventHandler* h);
  // After Remove, the fd's handler gets no more events, not even ones already fetched in the
  // round being dispatched (a handler may remove, and delete, another one).
  void Remove(int fd);
  // One round: waits up to timeout_ms (-1 forever) and dispatches events.
  Status RunOnce(int timeout_ms);

 private:
  UniqueFd epfd_;
  std::unordered_map<int, EventHandler*> handlers_;  // by fd
  std::unordered_set<EventHandler*> removed_;        // during the round being dispatched
};

}  // namespace dsec::agent
