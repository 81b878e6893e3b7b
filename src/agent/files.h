// File operations inside the sandbox: read (streamed, bounded), write (streamed, creates
// parents), list, stat, mkdir, remove, tar extract/create. Every path is resolved below the
// sandbox root with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS): symlinks (absolute or
// relative) resolve inside the sandbox and /proc/<pid>/fd-style magic links are refused.
// Operations run with the file system ids of the requesting user (setfsuid/setfsgid), so the
// kernel's permission checks apply and created files belong to that user; kernel file systems
// (proc, sysfs, cgroup, devpts) and non-regular files are refused for read and write.
#pragma once

#include <memory>

#include "agent/agent.h"
#include "protocol/messages.h"

namespace dsec::agent {

// Handles a file request ("read_file", "write_file", "list", "stat", "mkdir", "remove",
// "tar_extract", "tar_create"). Returns an op for streaming requests; for the others it
// answers directly and returns nullptr. Errors are answered on the channel.
std::unique_ptr<Op> HandleFileRequest(Agent* agent, uint32_t channel, const std::string& op,
                                      const protocol::Json& req);

// Paths from callers: absolute, no NUL, at most 4096 bytes.
Status ValidateSandboxPath(const std::string& path);

}  // namespace dsec::agent
