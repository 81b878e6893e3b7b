// A sandbox's network, owned beside its instance, on the node's network (node_network.h).
// A kind either hands over a network namespace (a container's: attached on the first policy
// that is not `none`, unplugged again on `none`, its loopback reachable for the port proxy) or
// asks for a tap device before it starts (a microVM's NIC, whose descriptor QEMU gets: a NIC
// cannot be added to a running microVM, so `none` later refuses everything and keeps it).
// Either way this replaces the policy live, counts refused packets and detaches.
//
// Thread safety: none; the owner serializes calls (Sandbox holds its lock).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "base/status.h"
#include "base/unique_fd.h"
#include "net/node_network.h"
#include "net/policy.h"

namespace dsec::net {

class SandboxNet {
 public:
  // The node network, started at its first use; unset: this edge has none (modes other than
  // none are refused).
  using NodeSource = std::function<StatusOr<NodeNetwork*>()>;
  // Opens the sandbox's network namespace (a new descriptor each call).
  using NamespaceSource = std::function<StatusOr<UniqueFd>()>;

  // `label` names the sandbox in the node's log of refused packets. Without `netns` the
  // sandbox has a network only through AttachTap.
  SandboxNet(NodeSource node, NamespaceSource netns, std::string label);

  // A tap device on the node for the sandbox (its descriptor for the VMM), with everything
  // refused until Apply.
  StatusOr<UniqueFd> AttachTap();

  // The sandbox's cgroup2 directory (duplicated): its egress is also guarded at connect() by
  // the node's EgressGuard, if it has one. Call before the first Apply or Readopt.
  Status SetCgroup(int cgroup_fd);

  // Gives the namespace a network if it has none yet (eth0, an address), then applies `p`
  // atomically. Mode none takes the network away again: the sandbox is left with loopback
  // only, as if it never had one.
  Status Apply(const NetworkPolicy& p);
  // After an edge restart: the attachment an adoption handle kept, with its policy again.
  Status Readopt(const NetAttachment& a, const NetworkPolicy& p);
  // Whether the edge can enter the sandbox's namespace (ConnectPort works); otherwise its
  // agent relays the port proxy's connections.
  bool has_namespace() const { return bool(netns_); }
  // A TCP connection to 127.0.0.1:port inside the namespace, whatever the policy: a
  // non-blocking socket whose connect has started (EINPROGRESS) or finished; never waits for
  // the server. Nothing listening is kUnavailable.
  StatusOr<UniqueFd> ConnectPort(uint16_t port);
  // Its IPv4 address, and the node's end of its link (the gateway); empty without a network.
  std::string Address() const;
  std::string Gateway() const;
  // Packets its policy refused so far.
  uint64_t Denied();
  // What an adoption handle keeps (empty: no network).
  const NetAttachment& attachment() const { return attachment_; }
  bool attached() const { return bool(attachment_); }
  // Removes its rules and conntrack entries and frees the address; the veth goes with the
  // namespace. Idempotent.
  void Detach();
  // Lets go without removing anything: a later edge adopts it.
  void Forget();

 private:
  NodeSource node_source_;
  NamespaceSource netns_;
  std::string label_;
  NodeNetwork* node_ = nullptr;
  NetAttachment attachment_;
  bool tap_ = false;  // attached by AttachTap
  UniqueFd cgroup_;
  bool guarded_ = false;  // the guard's programs are attached to cgroup_
  // Puts `p` in the egress guard (attaching it first), if there is one.
  Status Guard(const NetworkPolicy& p);
};

}  // namespace dsec::net
