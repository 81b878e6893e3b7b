// dsec-agent entry point. Started by the container backend from a sealed memfd as PID 1 of a
// new sandbox, with the edge connection on fd 3 and /dev/null on 0-2.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "agent/agent.h"
#include "agent/guest.h"
#include "agent/setup.h"
#include "agent/zygote_link.h"

using dsec::agent::kChannelFd;
using dsec::protocol::FrameType;
using dsec::protocol::Json;

namespace {

void SendBlocking(FrameType type, const Json& j) {
  std::string f = dsec::protocol::EncodeFrameOrDie(type, 0, 0, j.dump());
  size_t off = 0;
  while (off < f.size()) {
    ssize_t n = send(kChannelFd, f.data() + off, f.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

[[noreturn]] void Fail(const dsec::Status& s) {
  SendBlocking(FrameType::kError, dsec::protocol::ErrorJson(s));
  _exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--version") == 0) {
    printf("dsec-agent %s\n", DSEC_VERSION);
    return 0;
  }
  // A microVM guest's init (the same binary, packed into the guest's initramfs).
  if (dsec::agent::IsGuestInit(argc, argv)) dsec::agent::GuestMain();
  // Named for tools and tests; nothing in the sandbox may ptrace or read us.
  prctl(PR_SET_NAME, "dsec-agent", 0, 0, 0);
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  // A session (and so a scheduler autogroup) of our own: the launcher's is the edge's, and
  // root inside may write /proc/1/autogroup, whose nice value applies to the whole autogroup;
  // shared, it would let a sandbox deprioritize the edge and every other sandbox's agent.
  setsid();
  fcntl(kChannelFd, F_SETFD, FD_CLOEXEC);
  signal(SIGPIPE, SIG_IGN);
  // The launcher starts us with every signal blocked; only SIGCHLD (read via signalfd) is.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_SETMASK, &mask, nullptr);

  SendBlocking(FrameType::kHello, dsec::protocol::Encode(dsec::protocol::Hello{
                                      dsec::protocol::kProtocolVersion, getpid(), {}}));
  dsec::protocol::Frame frame;
  std::vector<dsec::UniqueFd> fds;
  if (dsec::Status s = dsec::agent::ReceiveFrameWithFds(kChannelFd, &frame, &fds); !s.ok()) Fail(s);
  if (frame.type != FrameType::kSetup) Fail(dsec::InvalidArgument("expected a setup frame"));
  auto json = dsec::protocol::ParseJson(frame.payload);
  if (!json.ok()) Fail(json.status());
  auto spec = dsec::protocol::SetupSpecFromJson(*json);
  if (!spec.ok()) Fail(spec.status());
  auto setup = dsec::agent::RunSetup(*spec, fds);
  if (!setup.ok()) Fail(setup.status().WithContext("sandbox setup"));
  dsec::agent::Agent agent(std::move(setup->config), dsec::UniqueFd(kChannelFd),
                           std::move(setup->listen));
  // An fncall worker is ready once its zygote is warm.
  if (dsec::Status s = dsec::agent::StartZygote(agent); !s.ok()) Fail(s);
  // The writable layer's fd number: the edge opens it through /proc/<pid>/fd for snapshots.
  SendBlocking(FrameType::kReady, dsec::protocol::Encode(dsec::protocol::Ready{
                                      getpid(), agent.config().writable_layer.get()}));
  return agent.Run();
}
