#include "net/sandbox_net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "net/netlink.h"

namespace dsec::net {

SandboxNet::SandboxNet(NodeSource node, NamespaceSource netns, std::string label)
    : node_source_(std::move(node)), netns_(std::move(netns)), label_(std::move(label)) {}

StatusOr<UniqueFd> SandboxNet::AttachTap() {
  if (attachment_) return FailedPrecondition("sandbox " + label_ + " already has a network");
  if (!node_source_)
    return Unimplemented("this edge has no sandbox network (network modes other than none)");
  DSEC_ASSIGN_OR_RETURN(node_, node_source_());
  UniqueFd tap;
  DSEC_ASSIGN_OR_RETURN(attachment_, node_->AttachTap(&tap, label_));
  tap_ = true;
  return tap;
}

Status SandboxNet::SetCgroup(int cgroup_fd) {
  cgroup_.Reset(fcntl(cgroup_fd, F_DUPFD_CLOEXEC, 0));
  if (!cgroup_) return ErrnoError("dup the sandbox's cgroup directory");
  return OkStatus();
}

Status SandboxNet::Guard(const NetworkPolicy& p) {
  EgressGuard* g = node_ && cgroup_ ? node_->guard() : nullptr;
  if (!g) return OkStatus();
  if (!guarded_) {
    DSEC_RETURN_IF_ERROR(g->Attach(cgroup_.get()));
    guarded_ = true;
  }
  return g->Set(cgroup_.get(), attachment_.addr, p);
}

Status SandboxNet::Apply(const NetworkPolicy& p) {
  if (tap_ && attachment_) return node_->Apply(attachment_, p);  // `none` refuses everything
  if (p.mode == NetMode::kNone) {
    // No network device at all, as a sandbox created with none: the veth and the address go.
    if (attachment_ && node_) node_->Unplug(attachment_);
    attachment_ = {};
    return guarded_ ? Guard(p) : OkStatus();
  }
  if (!attachment_) {
    if (!netns_)
      return FailedPrecondition("sandbox " + label_ +
                                " was created without a network and cannot get one while it "
                                "runs (a microVM's NIC is made at its start): create it with "
                                "the network it needs");
    if (!node_source_)
      return Unimplemented("this edge has no sandbox network (network modes other than none)");
    DSEC_ASSIGN_OR_RETURN(node_, node_source_());
    DSEC_ASSIGN_OR_RETURN(UniqueFd ns, netns_());
    // Attached with its policy in one transaction: nothing flows before it, nothing to flush.
    DSEC_ASSIGN_OR_RETURN(attachment_, node_->Attach(ns.get(), label_, &p));
    return Guard(p);
  }
  DSEC_RETURN_IF_ERROR(node_->Apply(attachment_, p));
  return Guard(p);
}

Status SandboxNet::Readopt(const NetAttachment& a, const NetworkPolicy& p) {
  if (!a) return OkStatus();
  if (!node_source_) return FailedPrecondition("this edge has no sandbox network");
  DSEC_ASSIGN_OR_RETURN(node_, node_source_());
  DSEC_RETURN_IF_ERROR(node_->Readopt(a, label_));
  attachment_ = a;
  tap_ = !netns_;
  DSEC_RETURN_IF_ERROR(node_->Apply(attachment_, p));
  return Guard(p);
}

StatusOr<UniqueFd> SandboxNet::ConnectPort(uint16_t port) {
  if (!netns_) return Unimplemented("sandbox " + label_ + " has no port proxy");
  DSEC_ASSIGN_OR_RETURN(UniqueFd ns, netns_());
  // Made in the sandbox's namespace, it connects to that namespace's loopback.
  DSEC_ASSIGN_OR_RETURN(UniqueFd s,
                        SocketIn(ns.get(), AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Non-blocking: a server that never accepts must not hold the caller (the sandbox's lock, a
  // worker); the caller waits for the connection to finish, with a deadline.
  if (connect(s.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0 && errno != EINPROGRESS) {
    if (errno == ECONNREFUSED)
      return Status(StatusCode::kUnavailable,
                    "nothing listens on port " + std::to_string(port) + " in sandbox " + label_);
    return ErrnoError("connect to port " + std::to_string(port) + " in sandbox " + label_);
  }
  return s;
}

std::string SandboxNet::Address() const {
  return attachment_ ? Ipv4ToString(attachment_.addr) : std::string();
}

std::string SandboxNet::Gateway() const {
  return attachment_ && node_ ? Ipv4ToString(node_->gateway()) : std::string();
}

uint64_t SandboxNet::Denied() {
  uint64_t at_connect = guarded_ && node_->guard() ? node_->guard()->Denied(cgroup_.get()) : 0;
  return at_connect + (attachment_ && node_ ? node_->Denied(attachment_) : 0);
}

void SandboxNet::Detach() {
  if (guarded_ && node_->guard()) node_->guard()->Forget(cgroup_.get());
  guarded_ = false;
  if (attachment_ && node_) node_->Detach(attachment_);
  attachment_ = {};
  tap_ = false;
}

void SandboxNet::Forget() {
  attachment_ = {};
  tap_ = false;
}

}  // namespace dsec::net
