// Passing file descriptors over unix sockets (SCM_RIGHTS).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec {

// Writes all of `bytes` (blocking), with `fds` attached to the first chunk.
Status SendWithFds(int sock, std::string_view bytes, const std::vector<int>& fds);

// One recvmsg of up to `max_bytes` into *bytes (replaced), taking up to `max_fds` passed fds
// (CLOEXEC; extra ones are closed). Returns the byte count: 0 means end of stream.
StatusOr<size_t> RecvWithFds(int sock, size_t max_bytes, size_t max_fds, std::string* bytes,
                             std::vector<UniqueFd>* fds);

}  // namespace dsec
