// A Backend whose sandboxes run nothing, for fast unit tests of what sits above sandboxes (the
// manager's state machine, admission and reaping; pools) without root. Each sandbox is a real
// Sandbox (sandbox.h) over a FakeInstance whose "agent" is the far end of a socketpair the
// backend holds: it answers nothing (agent calls wait, so tests of the manager make none), and
// KillAgent closes it, as when an agent dies.
#pragma once

#include <map>
#include <memory>

#include <optional>
#include <set>
#include <string>

#include "backends/sandbox.h"
#include "base/unique_fd.h"

namespace dsec::backends::testing {

class FakeBackend : public Backend {
 public:
  FakeBackend();
  ~FakeBackend() override;

  Kind kind() const override { return Kind::kContainer; }
  KindCapabilities Capabilities() const override { return caps; }
  StatusOr<std::shared_ptr<Sandbox>> Create(const SandboxSpec& spec) override;
  // Succeeds for a sandbox that was detached (not destroyed) from this backend.
  StatusOr<std::shared_ptr<Sandbox>> Adopt(const SandboxSpec& spec,
                                           const std::string& handle) override;
  StatusOr<int> CleanupOrphans() override;
  Resources Largest() const override { return largest; }

  Resources largest{.cpu = 4, .memory_mb = 8192, .pids = 0, .disk_mb = 65536};
  KindCapabilities caps;

  // The next Create fails with `s` (after nothing was made).
  void FailNextCreate(Status s);
  // The agent of sandbox `id` goes away: its Sandbox fails ("agent exited").
  void KillAgent(const std::string& id);
  int created() const;
  int destroyed() const;
  // Sandboxes made and neither destroyed nor detached.
  size_t alive() const;

  struct State;  // shared with the instances; defined in fake_backend.cc

 private:
  std::shared_ptr<State> state_;
  std::unique_ptr<IoRunner> io_;
};

}  // namespace dsec::backends::testing
