// The shape of a sandbox that every layer shares: the resources it may use (one struct, with
// one internal name per field, for the sandbox spec, create parameters, pool configs, `dsec
// run` and the edge's defaults) and the ids of the user it runs as by default. The public names
// (API fields, SDK arguments, CLI flags) are the REST layer's and do not change with these.
#pragma once

#include <cstdint>

namespace dsec {

struct Resources {
  double cpu = 1.0;         // CPU cap, in cores (cpu.max / cfs quota)
  int64_t memory_mb = 512;  // memory limit, MiB (a tmpfs writable layer is charged on top)
  int64_t pids = 256;       // processes and threads at once
  int64_t disk_mb = 256;    // the writable layer, MiB
  bool operator==(const Resources&) const = default;
};

// Cores in thousandths, rounded (what a quota counts and a node's default is published in).
inline int64_t CpuMilli(double cores) { return static_cast<int64_t>(cores * 1000 + 0.5); }

// The uid/gid of the default user ("sandbox") inside every sandbox, of every backend.
inline constexpr uint32_t kSandboxUid = 1000;
inline constexpr uint32_t kSandboxGid = 1000;

}  // namespace dsec
