#include "agent/capture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "base/file_util.h"
#include "base/strings.h"
#include "images/capture.h"

namespace dsec::agent {

namespace {

using protocol::FrameType;
using protocol::Json;

// Freezes (or thaws) the sandbox's user processes: cgroup2's cgroup.freeze of its user cgroup,
// then waits (briefly) until the kernel says they are frozen.
Status Freeze(int cgroup_user, bool on) {
  if (cgroup_user < 0) return FailedPrecondition("no user cgroup to freeze");
  UniqueFd f(openat(cgroup_user, "cgroup.freeze", O_WRONLY | O_CLOEXEC));
  if (!f) return ErrnoError("open cgroup.freeze");
  DSEC_RETURN_IF_ERROR(WriteAllFd(f.get(), on ? "1" : "0", "cgroup.freeze"));
  if (!on) return OkStatus();
  for (int i = 0; i < 500; ++i) {
    UniqueFd ev(openat(cgroup_user, "cgroup.events", O_RDONLY | O_CLOEXEC));
    auto text = ev ? ReadFdToString(ev.get(), "cgroup.events", 4096) : StatusOr<std::string>("");
    if (text.ok() && text->find("frozen 1") != std::string::npos) return OkStatus();
    usleep(2000);
  }
  return DeadlineExceeded("the sandbox's processes did not freeze within 1 s");
}

// The capture runs in a child (the agent's loop must go on relaying what it writes): the tar
// on one pipe, an error ("<code> <message>") on another.
class CaptureOp : public Op, public EventHandler {
 public:
  CaptureOp(Agent* agent, uint32_t channel, protocol::CaptureLayerRequest req)
      : Op(agent, channel), req_(std::move(req)) {}
  ~CaptureOp() override { Stop(); }

  void Begin() override {
    const int layer = agent_->config().writable_layer.get();
    UniqueFd upper(
        layer < 0 ? -1 : openat(layer, "upper", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!upper)
      return Fail(FailedPrecondition(
          "this agent holds no writable layer to capture (a container's is read by the edge)"));
    int data[2], err[2];
    if (pipe2(data, O_CLOEXEC) < 0) return Fail(ErrnoError("pipe"));
    data_.Reset(data[0]);
    UniqueFd data_w(data[1]);
    if (pipe2(err, O_CLOEXEC) < 0) return Fail(ErrnoError("pipe"));
    err_.Reset(err[0]);
    UniqueFd err_w(err[1]);
    if (Status s = Freeze(agent_->config().cgroup_user.get(), true); !s.ok()) {
      (void)Freeze(agent_->config().cgroup_user.get(), false);
      return Fail(s);
    }
    frozen_ = true;
    pid_t pid = fork();
    if (pid < 0) return Fail(ErrnoError("fork"));
    if (pid == 0) {
      data_.Reset();
      err_.Reset();
      images::CaptureOptions co;
      co.skip = req_.skip;
      co.empty = req_.empty;
      co.keep_setuid = req_.keep_setuid;
      co.max_apparent_bytes = req_.max_apparent_bytes;
      Status s = images::WriteLayerTar(
          {{upper.get(), "/"}}, co,
          [&](std::string_view d) { return WriteAllFd(data_w.get(), d, "the layer pipe"); },
          nullptr);
      if (!s.ok()) {
        std::string line = std::to_string(static_cast<int>(s.code())) + " " + s.message();
        (void)WriteAllFd(err_w.get(), line, "the error pipe");
      }
      _exit(s.ok() ? 0 : 1);
    }
    child_ = pid;
    agent_->WatchChild(pid, this);
    data_w.Reset();
    err_w.Reset();
    int fl = fcntl(data_.get(), F_GETFL);
    fcntl(data_.get(), F_SETFL, fl | O_NONBLOCK);
    if (Status s = agent_->loop().Add(data_.get(), EPOLLIN, this); !s.ok()) return Fail(s);
    registered_ = true;
  }

  void OnEvent(uint32_t) override { Read(); }
  void OnRoom() override {
    waiting_room_ = false;
    if (done_ || !registered_) return;
    agent_->loop().Modify(data_.get(), EPOLLIN, this);
    Read();
  }
  void OnControl(const Json& j) override {
    if (j.contains("close")) Fail(Status(StatusCode::kAborted, "capture stopped by the edge"));
  }
  void OnChildExit(pid_t, int wait_status) override {
    child_ = -1;
    status_ = wait_status;
    exited_ = true;
    MaybeDone();
  }
  void Cancel() override {
    done_ = true;
    Stop();
  }

 private:
  void Read() {
    char buf[protocol::kDataChunk];
    while (!done_ && !eof_) {
      if (!agent_->OutputHasRoom()) {
        agent_->loop().Modify(data_.get(), 0, this);
        if (!waiting_room_) agent_->WaitForRoom(this);
        waiting_room_ = true;
        return;
      }
      ssize_t n = read(data_.get(), buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) return;
        return Fail(ErrnoError("read the layer pipe"));
      }
      if (n == 0) {
        eof_ = true;
        agent_->loop().Remove(data_.get());
        registered_ = false;
        break;
      }
      bytes_ += static_cast<uint64_t>(n);
      agent_->Send(FrameType::kData, protocol::kBody, channel_,
                   std::string_view(buf, static_cast<size_t>(n)));
    }
    MaybeDone();
  }

  void MaybeDone() {
    if (done_ || !eof_ || !exited_) return;
    Thaw();
    if (WIFEXITED(status_) && WEXITSTATUS(status_) == 0) {
      done_ = true;
      Stop();
      return agent_->Finish(this, {{"bytes", bytes_}});
    }
    std::string err;
    char buf[1024];
    ssize_t n = err_ ? read(err_.get(), buf, sizeof buf) : -1;
    if (n > 0) err.assign(buf, static_cast<size_t>(n));
    size_t sp = err.find(' ');
    auto code = sp == std::string::npos ? std::nullopt : ParseInt64(err.substr(0, sp));
    Fail(code ? Status(static_cast<StatusCode>(*code), err.substr(sp + 1))
              : InternalError("the capture ended with status " + std::to_string(status_)));
  }

  void Thaw() {
    if (!frozen_) return;
    frozen_ = false;
    (void)Freeze(agent_->config().cgroup_user.get(), false);
  }

  void Fail(const Status& s) {
    if (done_) return;
    done_ = true;
    Stop();
    agent_->FinishWithError(this, s);
  }

  // The child killed (it is reaped by the agent's loop), the pipes closed, the sandbox thawed.
  void Stop() {
    if (child_ > 0) {
      kill(child_, SIGKILL);
      agent_->UnwatchChild(child_);
      child_ = -1;
    }
    if (registered_) agent_->loop().Remove(data_.get());
    registered_ = false;
    data_.Reset();
    err_.Reset();
    Thaw();
  }

  protocol::CaptureLayerRequest req_;
  UniqueFd data_, err_;
  pid_t child_ = -1;
  int status_ = 0;
  uint64_t bytes_ = 0;
  bool registered_ = false, frozen_ = false, done_ = false, eof_ = false, exited_ = false;
  bool waiting_room_ = false;
};

}  // namespace

StatusOr<Reply> HandleCaptureLayer(Agent* agent, uint32_t ch, protocol::CaptureLayerRequest req) {
  return Reply(std::make_unique<CaptureOp>(agent, ch, std::move(req)));
}

}  // namespace dsec::agent
