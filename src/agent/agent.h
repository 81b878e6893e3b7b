// dsec-agent: PID 1 of a sandbox. After setup (setup.h) it serves one edge connection at a
// time over the framed protocol: many concurrent operations, each on its own channel.
//
// Single-threaded around an epoll Loop. Memory is bounded: frames are bounded, the outgoing
// queue has a high-water mark above which output producers pause, exec output past its cap is
// counted and dropped, stdin is windowed by acks, and the number of concurrent execs and
// shells is capped. Operations bound to a channel are cancelled when the connection drops;
// shell sessions and background jobs (jobs.h) survive it, so a restarted edge that reconnects
// (listening socket + secret) finds them again.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "agent/loop.h"
#include "base/unique_fd.h"
#include "protocol/agent_ops.h"
#include "protocol/frame.h"
#include "protocol/messages.h"

namespace dsec::agent {

class Agent;
class Jobs;
class ShellSession;

// An operation bound to a channel (exec, file transfer, ...).
class Op {
 public:
  Op(Agent* agent, uint32_t channel) : agent_(agent), channel_(channel) {}
  virtual ~Op() = default;
  uint32_t channel() const { return channel_; }
  // Called once the agent registered the op on its channel; may Finish() at once.
  virtual void Begin() {}
  virtual void OnData(const protocol::Frame& f) { (void)f; }
  virtual void OnControl(const protocol::Json& j) { (void)j; }
  // The connection dropped: stop and release resources; no frames may be sent.
  virtual void Cancel() = 0;
  // The deadline passed (see Agent::SetDeadline).
  virtual void OnDeadline() {}
  // Room appeared in the outgoing queue after the op asked with WaitForRoom().
  virtual void OnRoom() {}
  // A child this op started was reaped.
  virtual void OnChildExit(pid_t pid, int wait_status) {
    (void)pid;
    (void)wait_status;
  }

 protected:
  Agent* agent_;
  uint32_t channel_;
};

// What an operation's handler answers: the response at once, or the op that streams it.
using Reply = std::variant<protocol::Json, std::unique_ptr<Op>>;

// Limits and identities from setup that operations need.
struct AgentConfig {
  isolation::Rlimits rlimits;
  UniqueFd cgroup_user;  // O_PATH dir of <sb>/user in cgroup2, or invalid
  bool cgroup_kill = true;
  uint32_t max_execs = 64;
  std::string secret;
  int64_t orphan_timeout_ms = -1;              // see SetupSpec
  std::optional<protocol::ZygoteSpec> zygote;  // an fncall worker (zygote_link.h)
  UniqueFd zygote_binary;                      // until the zygote is started
  // The writable layer's tmpfs, held for the edge's snapshots (never passed to children).
  UniqueFd writable_layer;
  // The host uid range lease (SetupFds::uid_lease), held open until the agent exits.
  UniqueFd uid_lease;
  // The connection is a microVM's virtio-serial port (agent/guest.h): it is kept when the host
  // end goes away, and a host end that connects again must authenticate like a reconnecting
  // edge does on the listening socket.
  bool guest_port = false;
  // A guest's: makes this machine the one an auth's identity names (a VM restored from
  // another's running state) before the hello. Unset: such an auth is refused.
  std::function<Status(const protocol::GuestIdentity&)> apply_identity;
};

class Agent {
 public:
  Agent(AgentConfig cfg, UniqueFd conn, UniqueFd listen);
  ~Agent();
  // Serves until a fatal error. Returns the process exit code.
  int Run();

  // --- used by operations ---
  Loop& loop() { return loop_; }
  const AgentConfig& config() const { return cfg_; }
  AgentConfig& mutable_config() { return cfg_; }
  // The fncall zygote, once started (zygote_link.h).
  void SetZygote(pid_t pid, UniqueFd control);
  bool ZygoteAlive() const;
  int zygote_control() const { return zygote_control_.get(); }
  void Send(protocol::FrameType type, uint8_t flags, uint32_t channel, std::string_view payload);
  void SendJson(protocol::FrameType type, uint32_t channel, const protocol::Json& j);
  // Final response: sends it and retires the op.
  void Finish(Op* op, const protocol::Json& response);
  void FinishWithError(Op* op, const Status& s);
  bool OutputHasRoom() const { return out_.size() - out_pos_ < kHighWater; }
  bool connected() const { return conn_.valid(); }
  void WaitForRoom(Op* op) { room_waiters_.insert(op); }
  void SetDeadline(Op* op, int64_t deadline_ms);  // 0 clears
  void WatchChild(pid_t pid, Op* op) { children_[pid] = op; }
  void UnwatchChild(pid_t pid) { children_.erase(pid); }
  // Reaps every exited child now (watched ones reach their op) instead of at the next round.
  void ReapChildren() { OnSigchld(); }
  // Execs + shells currently running, for the concurrency cap.
  int active_processes() const { return active_processes_; }
  void AdjustActive(int delta) { active_processes_ += delta; }
  // A fresh shell session id.
  std::string NextShellId();
  // Names a fresh child cgroup under <sb>/user; its directory is made by the caller.
  std::string NextCgroupName(char prefix);
  // Cgroups whose processes outlived their op; removed once empty.
  void AddLingeringCgroup(const std::string& name) { lingering_.insert(name); }
  void ReapLingeringCgroups();
  std::map<std::string, std::unique_ptr<ShellSession>>& shells() { return shells_; }
  // Background jobs (jobs.h): they outlive connections, like shells.
  Jobs& jobs() { return *jobs_; }
  // An op bound to no channel (a job's exec) that is done: destroyed at the end of the round.
  void RetireOwned(std::unique_ptr<Op> op);
  // Child processes that drain an exec's pipes after it finished (background children).
  void AdoptDrain(std::unique_ptr<EventHandler> drain) { drains_.push_back(std::move(drain)); }
  void RetireDrain(EventHandler* d);

  static constexpr size_t kHighWater = 4 << 20;
  static constexpr size_t kLowWater = 1 << 20;

 private:
  class ConnHandler;
  class ListenHandler;
  class SignalHandler;
  void OnConnReadable();
  void OnConnWritable();
  void OnAccept();
  void OnSigchld();
  void DropConnection(const std::string& why);
  void HandleFrame(protocol::Frame& f);
  void HandleRequest(uint32_t channel, const std::string& payload);
  void OnPendingReadable();  // a reconnecting edge before it authenticated
  // Guest mode: keeps the virtio-serial port until a host end (re)connects; needs_hangup: the
  // current host end was refused, so only one that connects after it hung up is taken.
  void WaitForHost(UniqueFd port, bool needs_hangup);
  // Guest mode: kAuth on the serving port (see HandleFrame).
  void TakeOverPort(const protocol::Frame& f);
  void SendHello();
  // A kAuth frame carrying this sandbox's secret.
  bool Authentic(const protocol::Frame& f) const;
  // After Authentic: the auth's identity, if any, applied (and its secret ours from here).
  Status TakeIdentity(const protocol::Frame& f);
  static std::string BadSecretFrame();
  static std::string ErrorFrame(const Status& st);
  void CheckPort();
  void Retire(Op* op);
  void FlushRetired();
  int NextTimeoutMs();
  void RunDeadlines();
  void UpdateConnInterest();

  AgentConfig cfg_;
  Loop loop_;
  UniqueFd conn_;
  UniqueFd listen_;
  UniqueFd pending_;  // a reconnecting edge before it authenticated
  UniqueFd port_;     // guest mode: the port while no edge is connected
  bool port_needs_hangup_ = false;
  int64_t port_retry_ms_ = 0;
  protocol::FrameDecoder pending_decoder_;
  int64_t pending_deadline_ = 0;
  int64_t orphan_deadline_ = 0;  // no edge connected since; 0 = connected or waiting forever
  UniqueFd sigfd_;
  std::unique_ptr<ConnHandler> conn_handler_;
  std::unique_ptr<ConnHandler> pending_handler_;
  std::unique_ptr<ListenHandler> listen_handler_;
  std::unique_ptr<SignalHandler> signal_handler_;
  protocol::FrameDecoder decoder_;
  std::string out_;
  size_t out_pos_ = 0;
  bool want_write_ = false;
  std::map<uint32_t, std::unique_ptr<Op>> ops_;
  std::vector<std::unique_ptr<Op>> retired_;
  std::set<Op*> room_waiters_;
  std::map<Op*, int64_t> deadlines_;
  std::map<pid_t, Op*> children_;
  std::map<std::string, std::unique_ptr<ShellSession>> shells_;
  std::vector<std::unique_ptr<EventHandler>> drains_;
  std::vector<std::unique_ptr<EventHandler>> retired_drains_;
  std::set<std::string> lingering_;
  int active_processes_ = 0;
  uint64_t cgroup_seq_ = 0;
  UniqueFd zygote_control_;
  UniqueFd zygote_pidfd_;
  // Last: its jobs' execs use everything above while they are torn down.
  std::unique_ptr<Jobs> jobs_;
};

}  // namespace dsec::agent
