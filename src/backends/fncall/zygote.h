// dsec-zygote: the resident process of an fncall worker. The worker's agent starts it as root
// (with CAP_SYS_ADMIN in the sandbox's user namespace, under the looser "zygote" seccomp
// profile) and talks to it over a SOCK_SEQPACKET socketpair at fd 3.
//
// Per call, prepared ahead of time (so the call only pays for its own work):
//   zygote --clone(new mnt, ipc, pid ns)--> call init (PID 1 of the call's pid namespace):
//   private mounts, the tree read-only, a fresh size-limited tmpfs on the workdir, /tmp and
//   /dev/shm, a new /proc; then no capabilities but SETUID/SETGID, no new privileges and the
//   full user seccomp profile; it forks the user process, which becomes the sandbox user at
//   once and waits on the control socket for the call (fds: call socket, request memfd, stdin,
//   stdout, stderr). The user process hands the call socket to the init, writes the call's
//   files and runs the code (python: in the warm interpreter it was forked from, and it reports
//   the exit code to the init before its interpreter is torn down; otherwise exec of the
//   runtime's command). The init reports the outcome on the call socket and exits, which kills
//   everything left in the call's pid namespace; when the agent closes the call socket
//   (timeout, cancel), the init exits at once, with the same effect. The zygote then prepares
//   the next call. The init is PID 1 so that the code gets the usual signal semantics (a
//   namespace's init ignores signals it has no handler for).
//
// Messages (JSON, one per SOCK_SEQPACKET datagram):
//   agent -> zygote  {"init": {"seccomp": [base64], "rlimits": {...}}}
//   zygote -> agent  {"ready": {"pid": N}} | {"error": "..."}
//   agent -> user    {"call": {}} + fds [call socket, request memfd, stdin, stdout, stderr]
//                    (the request memfd holds the protocol::FnCallSpec JSON)
//   user -> init     {} + fd [call socket]; later (python) {"rc": N}
//   init -> agent    (on the call socket) {"status": wait_status} | {"error": "..."}
#pragma once

namespace dsec::fncall {

inline constexpr int kZygoteControlFd = 3;
inline constexpr size_t kMaxControlMessage = 256 << 10;
inline constexpr size_t kMaxRequestBytes = 64 << 20;

}  // namespace dsec::fncall
