// File operations inside the sandbox: read (streamed, bounded), write (streamed, creates
// parents), list, stat, mkdir, remove, tar extract/create. Every path is resolved below the
// sandbox root by base/in_root.h (InRoot::kFollowInside): symlinks (absolute or
// relative) resolve inside the sandbox and /proc/<pid>/fd-style magic links are refused.
// Operations run with the file system ids of the requesting user (setfsuid/setfsgid), so the
// kernel's permission checks apply and created files belong to that user; kernel file systems
// (proc, sysfs, cgroup, devpts) and non-regular files are refused for read and write.
#pragma once

#include <memory>

#include "agent/agent.h"
#include "protocol/agent_ops.h"

namespace dsec::agent {

// The file operations of the agent's table (agent.cc). Each answers at once or returns the op
// that streams the body (read_file, tar_create) or takes it (write_file, tar_extract).
StatusOr<Reply> HandleReadFile(Agent* agent, uint32_t ch, protocol::ReadFileRequest req);
StatusOr<Reply> HandleWriteFile(Agent* agent, uint32_t ch, protocol::WriteFileRequest req);
StatusOr<Reply> HandleListDir(Agent* agent, uint32_t ch, protocol::ListDirRequest req);
StatusOr<Reply> HandleStat(Agent* agent, uint32_t ch, protocol::StatRequest req);
StatusOr<Reply> HandleWatchDir(Agent* agent, uint32_t ch, protocol::WatchDirRequest req);
StatusOr<Reply> HandleMakeDir(Agent* agent, uint32_t ch, protocol::MakeDirRequest req);
StatusOr<Reply> HandleRemove(Agent* agent, uint32_t ch, protocol::RemoveRequest req);
StatusOr<Reply> HandleTarExtract(Agent* agent, uint32_t ch, protocol::TarExtractRequest req);
StatusOr<Reply> HandleTarCreate(Agent* agent, uint32_t ch, protocol::TarCreateRequest req);

}  // namespace dsec::agent
