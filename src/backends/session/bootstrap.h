// The edge's side of an agent's first frames on a connection, for every kind (protocol/frame.h,
// protocol/agent_ops.h):
//
//   new sandbox:  agent -> hello, edge -> setup (with fds where the stream carries them),
//                 agent -> ready | error
//   reconnect:    edge -> auth, agent -> hello | error ("unauthenticated")
//
// A kind hands over a connected stream and says what carries its agent (a microVM's QEMU), so
// that a silent or vanished agent is reported with what the user needs to read (QEMU's log, the
// guest's console); everything else about the handshake — deadlines, frame reads, versions, the
// typed messages, a reconnect's resync past bytes a previous edge left unread — is here once.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/json.h"
#include "base/status.h"
#include "protocol/agent_ops.h"
#include "protocol/frame.h"

namespace dsec::backends {

// What a kind says about the process that carries its agent.
struct AgentCarrier {
  std::string name = "the agent";  // in messages: "<name> did not answer within ..."
  // Readable once the carrier is gone (a microVM's QEMU pidfd); -1: the connection says it.
  int exit_fd = -1;
  // Turns a raw timeout (kDeadlineExceeded) or hang-up (kUnavailable) into the error a user
  // reads; unset: the raw error.
  std::function<Status(Status)> explain;
};

class AgentBootstrap {
 public:
  explicit AgentBootstrap(int fd, AgentCarrier carrier = {});

  // The next whole frame, by `deadline_ms` (MonotonicMs()).
  StatusOr<protocol::Frame> Next(int64_t deadline_ms);
  // The first frame: a hello in a version this edge speaks. An error frame (the agent could
  // not start: a guest's init that could not build its root) is kUnavailable with its reason.
  StatusOr<protocol::Hello> ExpectHello(int64_t deadline_ms);
  // The setup frame, with `fds` attached (none on a virtio-serial port).
  Status SendSetup(const Json& setup, const std::vector<int>& fds = {});
  // The setup's answer: ready, or the agent's error.
  StatusOr<protocol::Ready> ExpectReady(int64_t deadline_ms);

 private:
  Status Explain(Status raw) const;

  int fd_;
  AgentCarrier carrier_;
  protocol::FrameDecoder dec_;
  int64_t started_ms_;
};

// Authenticates to a running agent on a fresh connection `fd`: a typed auth, then the first
// whole hello or error frame in the stream (what the agent wrote to a previous edge and nobody
// read may come first: a microVM's port keeps it). A refused secret is kUnauthenticated.
StatusOr<protocol::Hello> Reauthenticate(int fd, const std::string& secret, int64_t deadline_ms);
// The same with a whole auth (a microVM fork's carries the identity it takes: a failure to take
// it is that error).
StatusOr<protocol::Hello> Reauthenticate(int fd, const protocol::Auth& auth, int64_t deadline_ms);

}  // namespace dsec::backends
