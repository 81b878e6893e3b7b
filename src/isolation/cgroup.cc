// Picks the cgroup driver for this host: pure v2 when the cgroup2 mount carries the memory,
// pids and cpu controllers, otherwise the v1 hybrid.
#include "isolation/cgroup.h"

#include "base/enum_names.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/strings.h"
#include "isolation/cgroup_internal.h"

namespace dsec::isolation {

StatusOr<std::unique_ptr<CgroupDriver>> NewCgroupV2Driver(const std::string& root,
                                                          const CgroupDriverOptions& opts);
StatusOr<std::unique_ptr<CgroupDriver>> NewCgroupV1HybridDriver(
    const internal::CgroupMounts& mounts, const CgroupDriverOptions& opts);

StatusOr<std::unique_ptr<CgroupDriver>> CgroupDriver::Create(const CgroupDriverOptions& opts) {
  DSEC_RETURN_IF_ERROR(ValidateSafeName("instance id", opts.instance_id));
  internal::CgroupMounts mounts;
  if (opts.v2_root.empty() && opts.v1_root.empty()) {
    DSEC_ASSIGN_OR_RETURN(mounts, internal::DetectCgroupMounts());
  } else {
    mounts.v2 = opts.v2_root;
    if (!opts.v1_root.empty())
      for (const char* c : {"memory", "pids", "cpu", "freezer", "cpuacct"})
        mounts.v1[c] = JoinPath(opts.v1_root, c);
  }
  CgroupMode mode = opts.mode;
  if (mode == CgroupMode::kAuto) {
    mode = CgroupMode::kV1;
    if (!mounts.v2.empty()) {
      auto ctrl = ReadFileToString(JoinPath(mounts.v2, "cgroup.controllers"));
      if (ctrl.ok() && ctrl->find("memory") != std::string::npos) mode = CgroupMode::kV2;
    }
  }
  if (mode == CgroupMode::kV2) {
    if (mounts.v2.empty()) return Unimplemented("cgroup v2 requested but no cgroup2 mount found");
    return NewCgroupV2Driver(mounts.v2, opts);
  }
  return NewCgroupV1HybridDriver(mounts, opts);
}

namespace {
constexpr EnumName<CgroupMode> kCgroupModes[] = {
    {CgroupMode::kAuto, "auto"}, {CgroupMode::kV1, "v1"}, {CgroupMode::kV2, "v2"}};
}  // namespace

std::string_view CgroupModeName(CgroupMode m) { return NameIn(kCgroupModes, m); }

StatusOr<CgroupMode> ParseCgroupMode(std::string_view s) {
  if (auto m = ValueIn(kCgroupModes, s)) return *m;
  return InvalidArgument("cgroup_mode must be " + NamesIn(kCgroupModes) + ", not \"" +
                         std::string(s) + "\"");
}

}  // namespace dsec::isolation
