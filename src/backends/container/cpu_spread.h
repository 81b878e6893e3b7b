// Which CPUs a sandbox's processes run on, so that it sees as many CPUs as its cap allows
// (nproc, sched_getaffinity, Python's os.cpu_count through /sys/devices/system/cpu/online)
// and sandboxes still spread over the node's cores: a sandbox capped at `cpu` is given
// ceil(cpu) CPUs, those with the fewest sandboxes on them now (lowest number first on a tie).
// A sandbox whose cap reaches every usable CPU is not pinned and not counted.
//
// The affinity is a view, not a limit (the CPU cap is the cgroup's quota): a process inside
// may widen its own mask, and gets nothing more for it.
#pragma once

#include <sched.h>

#include <string>
#include <vector>

#include "base/mutex.h"

namespace dsec::backends::container {

class CpuSpread {
 public:
  // `usable`: the CPUs sandboxes may be given (this process's affinity).
  explicit CpuSpread(std::vector<int> usable);
  // The CPUs of this process's affinity mask.
  static std::vector<int> UsableNow();

  // ceil(cpu) CPUs for a new sandbox, counted until Give; empty when it gets all of them.
  std::vector<int> Take(double cpu);
  // Counts CPUs an existing sandbox runs on (adopted after a restart); ignores unknown ones.
  void Claim(const std::vector<int>& cpus);
  void Give(const std::vector<int>& cpus);
  size_t usable() const { return usable_.size(); }
  // Sandboxes pinned to each usable CPU, in the order of usable (for tests).
  std::vector<int> Load();

 private:
  const std::vector<int> usable_;
  Mutex mu_;
  std::vector<int> load_ DSEC_GUARDED_BY(mu_);  // per entry of usable_
};

// "0-2,5": the kernel's CPU list format (sorted input).
std::string CpuListText(const std::vector<int>& cpus);
// The CPUs of a cpu_set_t, ascending.
std::vector<int> CpusOf(const cpu_set_t& set);

}  // namespace dsec::backends::container
