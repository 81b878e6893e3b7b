// dsec-zygote: the resident process of an fncall worker. The worker's agent starts it as root
// (with CAP_SYS_ADMIN in the sandbox's user namespace, under the looser "zygote" seccomp
// profile) and talks to it over a SOCK_SEQPACKET socketpair at fd 3.
//
// Per call, from a process forked ahead of time (so the call only pays for its own work):
//   zygote --fork--> shim --unshare(mnt, ipc, pid), fork--> call init (PID 1 of a fresh pid
//   namespace): private mounts, a fresh size-limited tmpfs on the workdir, /tmp and /dev/shm,
//   a new /proc, the rest of the tree read-only, then no capabilities but SETUID/SETGID, no new
//   privileges and the full user seccomp profile, and waits for its call.
//   The call arrives (fds: call socket, request memfd, stdin, stdout, stderr); the init forks
//   the user process, which drops to the sandbox user, writes the call's files and runs the
//   code (python: in the warm interpreter it was forked from; otherwise exec of the runtime's
//   command). When the user process exits, the init reports its wait status on the call
//   socket and exits, which kills everything left in the call's pid namespace; when the agent
//   closes the call socket (timeout, cancel), the init exits at once, with the same effect.
//
// Messages (JSON, one per SOCK_SEQPACKET datagram):
//   agent -> zygote  {"init": {"seccomp": [base64], "rlimits": {...}}}
//   zygote -> agent  {"ready": {"pid": N}} | {"error": "..."}
//   agent -> init    {"call": {}} + fds [call socket, request memfd, stdin, stdout, stderr]
//                    (the request memfd holds the protocol::FnCallSpec JSON)
//   init -> agent    (on the call socket) {"status": wait_status} | {"error": "..."}
#pragma once

namespace dsec::fncall {

inline constexpr int kZygoteControlFd = 3;
inline constexpr size_t kMaxControlMessage = 256 << 10;
inline constexpr size_t kMaxRequestBytes = 64 << 20;

}  // namespace dsec::fncall
