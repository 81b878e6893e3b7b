// A blocking client of QEMU's machine protocol (QMP) on a unix socket: the edge's control of
// one microVM (stop, cont, quit, reading the console ring). One command at a time; events
// QEMU sends meanwhile are skipped. Every call has a deadline, so a wedged QEMU cannot hang
// the caller.
#pragma once

#include <string>
#include <vector>

#include "base/json.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::backends::microvm {

class QmpClient {
 public:
  // Connects to `path` (retrying until QEMU listens), reads the greeting and negotiates
  // capabilities.
  static StatusOr<QmpClient> Connect(const std::string& path, int timeout_ms);

  QmpClient(QmpClient&&) = default;
  QmpClient& operator=(QmpClient&&) = default;

  // Runs `command` and returns its "return" value; QEMU's error as a status. `pass_fd` (when
  // >= 0) goes along with the command (SCM_RIGHTS), as "getfd" and "add-fd" want.
  StatusOr<Json> Execute(const std::string& command, const Json& arguments = Json::object(),
                         int timeout_ms = 5000, int pass_fd = -1);
  // Polls `query` until its reply's "status" is none of `busy` (returns that status), at most
  // timeout_ms.
  StatusOr<std::string> WaitStatus(const std::string& query, const std::vector<std::string>& busy,
                                   int timeout_ms);
  int fd() const { return fd_.get(); }

 private:
  explicit QmpClient(UniqueFd fd) : fd_(std::move(fd)) {}
  // The next JSON message (one per line), waiting at most until deadline_ms (MonotonicMs).
  StatusOr<Json> ReadMessage(int64_t deadline_ms);

  UniqueFd fd_;
  std::string buf_;
};

}  // namespace dsec::backends::microvm
