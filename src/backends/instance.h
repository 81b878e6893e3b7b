// Where a new execution form plugs in. A backend (Backend, sandbox.h) makes one Instance per
// sandbox: the part that differs between forms — building and tearing down what runs the
// agent (namespaces and cgroups for a container; a QEMU process for a microVM), pausing it,
// reading its resources, capturing its writable layer, and handing over a connected stream to
// its dsec-agent. Everything a sandbox does once its agent runs (exec, stdin, shells, files,
// archives, signals, grader isolation, the state machine) is Sandbox + AgentSession and comes
// for free.
//
// Contract: Sandbox calls Start or Adopt once, then any of the others; it serializes all calls
// except OomKills (which may run on an I/O thread at any time, also after Destroy). Destroy
// must be idempotent and remove every kernel object and file the instance made, also after a
// failed Start or Adopt (Sandbox calls it then).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backends/sandbox_types.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::net {
class SandboxNet;
}

namespace dsec::backends {
class AgentSession;
}  // namespace dsec::backends

namespace dsec::backends {

// Counts the OOM kills in the sandbox so far (a cgroup's counter, a guest's). Must stay
// callable after the instance is destroyed (answer the last value, or 0).
using OomCounter = std::function<uint64_t()>;

// A running agent, as Start and Adopt hand it over.
struct AgentLink {
  UniqueFd stream;                  // a connected stream socket; the handshake is done
  std::vector<std::string> shells;  // shell sessions the agent already holds (adopt)
  bool paused = false;              // the instance is paused (adopting a paused sandbox)
};

// Progress of a capture (Instance::CaptureStack): bytes of the layer read so far.
using CaptureProgress = std::function<void(uint64_t bytes, bool read_all)>;

class Instance {
 public:
  virtual ~Instance() = default;
  virtual Kind kind() const = 0;
  // The spec it was made with; Start may complete it (an image's environment, the hostname).
  virtual const SandboxSpec& spec() const = 0;

  // Builds everything and starts the agent.
  virtual StatusOr<AgentLink> Start() = 0;
  // Takes over what an earlier edge made from its AdoptionHandle(). kAlreadyExists when
  // another live process owns it (then Destroy must leave it alone).
  virtual StatusOr<AgentLink> Adopt(const std::string& handle) = 0;
  // What a later process needs to Adopt: an opaque string holding secrets.
  virtual std::string AdoptionHandle() const = 0;
  // Valid after Start or Adopt succeeded.
  virtual OomCounter OomKills() = 0;

  virtual Status Pause() = 0;
  virtual Status Resume() = 0;
  // Everything but exec_count (the Sandbox counts those).
  virtual StatusOr<SandboxStats> Stats() = 0;
  // The memory limit in bytes, the writable layer included when it is in memory.
  virtual Status SetMemoryLimit(int64_t bytes) = 0;
  // The image stack with the writable layer captured on top (Sandbox::CaptureStack); `running`:
  // the instance is not paused, so it must be held still while it is read.
  // `progress` (may be empty) is called as the layer is read: the bytes so far, and once more
  // with `read_all` when it is all read and is being stored.
  // (What a kind cannot do at all is refused before it gets here: Backend::Capabilities.)
  // `session`: the running sandbox's agent (a kind whose writable layer only its agent can
  // read asks it); null while paused.
  virtual StatusOr<std::vector<std::string>> CaptureStack(bool keep_setuid, bool running,
                                                          const CaptureProgress& progress,
                                                          AgentSession* session) = 0;

  // Its running machine's whole state (memory, processes, devices), which a sandbox of this
  // kind created with it (SandboxSpec::machine) starts from; `running`: it runs (it is held
  // still while saved and runs on after). Only where KindCapabilities::fork_memory says so.
  virtual StatusOr<std::shared_ptr<const MachineState>> SaveMachine(bool running) {
    (void)running;
    return Unimplemented("this kind of sandbox cannot save its running machine");
  }

  // Its network on the node's (net/sandbox_net.h: policy, address, refused packets, the port
  // proxy's connections), over a namespace the kind made; null for a kind without one
  // (Backend::Capabilities says so before anything asks).
  virtual net::SandboxNet* Network() = 0;
  virtual Status Destroy() = 0;
  // Lets go without destroying: everything keeps running for a later Adopt.
  virtual void Detach() = 0;
};

}  // namespace dsec::backends
