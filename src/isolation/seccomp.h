// Seccomp profile for user code, per DESIGN.md: an allowlist (default ENOSYS, so libc falls
// back from syscalls it does not know) with the dangerous calls explicitly EPERM: mount
// family, bpf, keyctl, userfaultfd, perf_event_open, io_uring, kexec/modules,
// open_by_handle_at, unshare/setns and namespace flags on clone, TIOCSTI/TIOCLINUX, device
// mknod. clone3 is ENOSYS because seccomp cannot inspect its flags (libc then uses clone).
// Non-native ABIs (i386 via int 0x80) kill the process; x32 numbers never match the allowlist.
//
// Compiled once on the host with libseccomp and shipped to the agent as raw BPF, so the
// static agent does not link libseccomp. The agent installs it on itself once setup is done
// and every process in the sandbox inherits it: installing a filter means a BPF JIT compile
// (~0.5 ms on a nested VM), which must not happen per exec.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace dsec::isolation {

struct SeccompOptions {
  // Allow ptrace/process_vm_* of the caller's own processes (strace, gdb). The kernel's
  // ptrace access checks still keep the agent and other uids out.
  bool allow_ptrace = true;
  // The looser profile of an fncall worker (its agent and zygote): additionally mount/umount2
  // and clone with CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC, which the zygote needs to give
  // each call fresh namespaces and tmpfs. Each call's child installs the full profile on top
  // before user code runs (filters stack; the strictest answer wins).
  bool zygote = false;
};

// Returns the filter programs (currently one), each a struct sock_filter array in bytes, to be
// installed in order (seccomp stacks them; the strictest result wins).
StatusOr<std::vector<std::string>> BuildUserSeccompFilter(const SeccompOptions& opts);
// The same profile in libseccomp's pseudo-filter-code text, for review and debugging.
StatusOr<std::string> DescribeUserSeccompFilter(const SeccompOptions& opts);

}  // namespace dsec::isolation
