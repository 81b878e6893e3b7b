#pragma once
// What an edge keeps about a running microVM so that the next edge can adopt it after a
// restart (stored with the sandbox's record, opaque to the manager). Pure: encoding and parsing
// only; MicrovmInstance fills it in and acts on it. The container kind's counterpart is
// backends/container/adoption_handle.h.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace dsec::backends::microvm {

struct VmAdoptionHandle {
  std::string secret;     // the guest agent's auth secret (never empty)
  int64_t uid_slot = -1;  // the host uid range QEMU runs as; -1 none
  pid_t qemu_pid = 0;     // checked against the sandbox's cgroup before it is trusted
  std::vector<std::string> layer_digests;  // the image's layers, bottom first (held again)
  uint32_t net_addr = 0;                   // its NIC's address on the node (0: no network)
  std::string net_if;                      // and its tap's name

  std::string Encode() const;
  // Unknown keys are ignored (a newer edge's handle); a missing or empty secret, a missing
  // QEMU pid, or a field of the wrong type is an error.
  static StatusOr<VmAdoptionHandle> Parse(const std::string& text);
};

}  // namespace dsec::backends::microvm
