#include "cli/attach.h"

#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/websocket.hpp>
#include <deque>
#include <iostream>
#include <thread>

#include "base/base64.h"
#include "base/file_util.h"
#include "base/mutex.h"

namespace dsec::cli {

namespace asio = boost::asio;
namespace beast = boost::beast;

RawTerminal::RawTerminal() {
  if (tcgetattr(STDIN_FILENO, &saved_) == 0) {
    termios raw = saved_;
    cfmakeraw(&raw);
    active_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
  }
}

RawTerminal::~RawTerminal() {
  if (active_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
}

bool StdioIsTerminal() { return isatty(STDIN_FILENO) && isatty(STDOUT_FILENO); }

namespace {

constexpr size_t kMaxQueuedStdin = 4 << 20;

Status ErrorFrameStatus(const Json& e) {
  std::string code = e.value("code", "internal");
  std::string msg = e.value("message", "the command failed");
  if (code == "not_found") return NotFound(msg);
  if (code == "over_capacity") return Status(StatusCode::kOverCapacity, msg);
  if (code == "bad_request") return InvalidArgument(msg);
  if (code == "unavailable") return Unavailable(msg);
  return InternalError(msg);
}

// All WebSocket operations run on the client's io_context in the calling thread; the stdin and
// signal threads only post to it.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(asio::io_context& io, EdgeClient::WebSocket& ws) : io_(io), ws_(ws) {}

  // Thread-safe. Returns false once the session has ended.
  bool Post(std::string data, bool binary) {
    MutexLock l(mu_);
    if (ended_) return false;
    queued_ += data.size();
    asio::post(io_, [self = shared_from_this(), d = std::move(data), binary]() mutable {
      self->q_.emplace_back(std::move(d), binary);
      if (!self->writing_) self->WriteNext();
    });
    return true;
  }
  // Blocks the stdin reader while too much is queued; false once ended.
  bool WaitForRoom() {
    MutexLock l(mu_);
    cv_.Wait(l, [&]() DSEC_REQUIRES(mu_) { return ended_ || queued_ < kMaxQueuedStdin; });
    return !ended_;
  }
  bool ended() {
    MutexLock l(mu_);
    return ended_;
  }

  void Start() { Read(); }

  std::optional<Json> result;
  Status error;

 private:
  void WriteNext() {
    writing_ = true;
    ws_.binary(q_.front().second);
    ws_.async_write(asio::buffer(q_.front().first),
                    [self = shared_from_this()](beast::error_code ec, size_t) {
                      size_t n = self->q_.front().first.size();
                      self->q_.pop_front();
                      {
                        MutexLock l(self->mu_);
                        self->queued_ -= n;
                      }
                      self->cv_.NotifyAll();
                      if (ec || self->q_.empty()) {
                        self->writing_ = false;
                        if (ec) self->q_.clear();  // the read side reports how it ended
                        return;
                      }
                      self->WriteNext();
                    });
  }

  void Read() {
    ws_.async_read(rbuf_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) {
        if (!self->result && self->error.ok())
          self->error = ec == beast::websocket::error::closed
                            ? Unavailable("the edge closed the session without an exit status")
                            : Unavailable("connection to the edge lost: " + ec.message());
        self->End();
        return;
      }
      std::string data = beast::buffers_to_string(self->rbuf_.data());
      self->rbuf_.consume(self->rbuf_.size());
      if (self->ws_.got_binary()) {
        (void)WriteAllFd(STDOUT_FILENO, data, "stdout");
      } else {
        self->OnText(data);
      }
      self->Read();
    });
  }

  void OnText(const std::string& data) {
    auto j = ParseJson(data);
    if (!j.ok() || !j->is_object()) return;
    if (auto it = j->find("stderr"); it != j->end() && it->is_string()) {
      if (auto d = Base64Decode(it->get<std::string>())) (void)WriteAllFd(STDERR_FILENO, *d, "");
    } else if (auto ex = j->find("exit"); ex != j->end() && ex->is_object()) {
      result = *ex;
    } else if (auto er = j->find("error"); er != j->end() && er->is_object()) {
      error = ErrorFrameStatus(*er);
    }
  }

  void End() {
    {
      MutexLock l(mu_);
      ended_ = true;
    }
    cv_.NotifyAll();
    io_.stop();
  }

  asio::io_context& io_;
  EdgeClient::WebSocket& ws_;
  beast::flat_buffer rbuf_;
  std::deque<std::pair<std::string, bool>> q_;
  bool writing_ = false;
  Mutex mu_;
  CondVar cv_;
  size_t queued_ DSEC_GUARDED_BY(mu_) = 0;
  bool ended_ DSEC_GUARDED_BY(mu_) = false;
};

const char* SignalName(int sig) {
  switch (sig) {
    case SIGINT:
      return "INT";
    case SIGTERM:
      return "TERM";
    case SIGHUP:
      return "HUP";
    case SIGQUIT:
      return "QUIT";
    default:
      return "KILL";
  }
}

}  // namespace

StatusOr<Json> AttachAndRun(EdgeClient& client, const std::string& sandbox_id,
                            const AttachOptions& o) {
  std::string target = "/v1/sandboxes/" + UrlEncode(sandbox_id, false) + "/attach?tty=";
  target += o.tty ? "1" : "0";
  if (o.shell) target += "&shell=" + UrlEncode(*o.shell);
  for (const auto& a : o.cmd) target += "&cmd=" + UrlEncode(a);
  if (!o.user.empty()) target += "&user=" + UrlEncode(o.user);
  if (!o.cwd.empty()) target += "&cwd=" + UrlEncode(o.cwd);
  for (const auto& e : o.env) target += "&env=" + UrlEncode(e);
  if (o.timeout_ms > 0) target += "&timeout_ms=" + std::to_string(o.timeout_ms);
  if (o.tty) {
    winsize ws{};
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col && ws.ws_row)
      target += "&cols=" + std::to_string(ws.ws_col) + "&rows=" + std::to_string(ws.ws_row);
  }

  // Forwarded signals are taken by one thread; block them before any thread starts. SIGUSR1
  // wakes that thread when the session ends (it would otherwise finish its 100 ms wait: the
  // bulk of a `dsec run true`).
  sigset_t sigs, old;
  sigemptyset(&sigs);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH, SIGUSR1}) sigaddset(&sigs, s);
  pthread_sigmask(SIG_BLOCK, &sigs, &old);

  auto ws = client.OpenWebSocket(target);
  if (!ws.ok()) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return ws.status();
  }
  auto session = std::make_shared<Session>(client.io(), **ws);
  std::unique_ptr<RawTerminal> raw;
  if (o.tty && isatty(STDIN_FILENO)) raw = std::make_unique<RawTerminal>();

  // stdin: may block in read(2) on a terminal forever, so it is detached; it holds the session
  // and stops posting once the session ended.
  std::thread([session, forward = o.forward_stdin] {
    if (forward) {
      std::string buf(64 << 10, '\0');
      while (true) {
        ssize_t n = read(STDIN_FILENO, buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (!session->WaitForRoom()) return;
        if (!session->Post(buf.substr(0, static_cast<size_t>(n)), true)) return;
      }
    }
    session->Post(R"({"eof":true})", false);
  }).detach();
  std::thread signal_thread([session, &sigs, tty = o.tty] {
    int interrupts = 0;
    while (!session->ended()) {
      timespec ts{0, 100 * 1000 * 1000};
      int sig = sigtimedwait(&sigs, nullptr, &ts);
      if (sig <= 0 || sig == SIGUSR1) continue;  // (SIGUSR1: look at ended() again)
      if (sig == SIGWINCH) {
        winsize w{};
        if (tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) == 0)
          session->Post(Json({{"resize", {w.ws_col, w.ws_row}}}).dump(), false);
        continue;
      }
      ++interrupts;
      session->Post(Json({{"signal", interrupts > 1 ? "KILL" : SignalName(sig)}}).dump(), false);
    }
  });

  client.io().restart();
  session->Start();
  client.io().run();
  pthread_kill(signal_thread.native_handle(), SIGUSR1);  // pending until taken: never lost
  signal_thread.join();
  raw.reset();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  beast::error_code ec;
  beast::get_lowest_layer(**ws).close(ec);
  if (session->result) return *session->result;
  return session->error.ok() ? Unavailable("the session ended without an exit status")
                             : session->error;
}

int ExitCodeForResult(const Json& r, double timeout_s) {
  int code = r.value("exit_code", 125);
  if (r.value("timed_out", false)) {
    std::cerr << "dsec: command timed out after " << timeout_s << " s\n";
    return 124;
  }
  if (r.value("oom_killed", false)) std::cerr << "dsec: command was killed by the OOM killer\n";
  if (r.value("stdout_truncated", false) || r.value("stderr_truncated", false))
    std::cerr << "dsec: output was truncated at the edge's output cap\n";
  return code;
}

}  // namespace dsec::cli
