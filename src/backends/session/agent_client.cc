#include <utility>  // before asio: Boost 1.74's awaitable.hpp needs std::exchange

#include "backends/session/agent_client.h"

#include <boost/asio.hpp>
#include <chrono>
#include <deque>
#include <future>
#include <thread>
#include <vector>

#include "base/file_util.h"
#include "base/mutex.h"

namespace dsec::backends {

namespace asio = boost::asio;
using protocol::Frame;
using protocol::FrameType;
using protocol::Json;

struct AgentClient::Impl {
  Impl(asio::io_context& io, int fd)
      : strand(asio::make_strand(io)), socket(strand, asio::local::stream_protocol(), fd) {}
  asio::strand<asio::io_context::executor_type> strand;
  asio::local::stream_protocol::socket socket;
  protocol::FrameDecoder decoder;
  std::array<char, 64 * 1024> rbuf;
  std::deque<std::string> wqueue;
  bool writing = false;
  // Bytes of frames handed to the strand and not yet written (wqueue plus the write in
  // progress, plus frames posted but not yet queued); uploads wait on room_cv for room.
  std::atomic<uint64_t> queued{0};
  Mutex room_mu;
  CondVar room_cv;
  std::map<uint32_t, std::shared_ptr<Call>> calls;
  std::function<void(const Status&)> on_closed;
  bool shut = false;
};

std::shared_ptr<AgentClient> AgentClient::Create(asio::io_context& io, UniqueFd conn) {
  int fd = conn.Release();
  return std::shared_ptr<AgentClient>(new AgentClient(std::make_unique<Impl>(io, fd)));
}

AgentClient::AgentClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AgentClient::~AgentClient() {
  boost::system::error_code ec;
  impl_->socket.close(ec);
}

void AgentClient::Start(std::function<void(const Status&)> on_closed) {
  auto self = shared_from_this();
  asio::dispatch(impl_->strand, [self, cb = std::move(on_closed)]() mutable {
    self->impl_->on_closed = std::move(cb);
    // Reads run until the connection ends; the read loop holds a reference to the client.
    struct Reader {
      std::shared_ptr<AgentClient> c;
      void operator()() {
        auto* impl = c->impl_.get();
        impl->socket.async_read_some(
            asio::buffer(impl->rbuf),
            asio::bind_executor(impl->strand, [c = c](boost::system::error_code ec, size_t n) {
              auto* impl = c->impl_.get();
              if (ec) {
                c->Close();
                return;
              }
              if (!impl->decoder.Feed(std::string_view(impl->rbuf.data(), n)).ok()) {
                c->Close();
                return;
              }
              Frame f;
              while (impl->decoder.Next(&f)) {
                auto it = impl->calls.find(f.channel);
                if (it == impl->calls.end()) continue;  // late frames of a finished call
                std::shared_ptr<Call> call = it->second;
                switch (f.type) {
                  case FrameType::kData:
                    call->OnData(f.stream(), f.payload);
                    break;
                  case FrameType::kEvent: {
                    auto j = protocol::ParseJson(f.payload);
                    if (j.ok()) call->OnEvent(*j);
                    break;
                  }
                  case FrameType::kResponse: {
                    impl->calls.erase(it);
                    auto j = protocol::ParseJson(f.payload);
                    if (!j.ok()) {
                      call->OnResponse(InternalError("agent sent a malformed response"));
                    } else if (Status s = protocol::StatusFromJson(*j); !s.ok()) {
                      call->OnResponse(s);
                    } else {
                      call->OnResponse(std::move(*j));
                    }
                    break;
                  }
                  default:
                    break;
                }
              }
              if (impl->decoder.failed()) {
                c->Close();
                return;
              }
              Reader{c}();
            }));
      }
    };
    Reader{self}();
  });
}

namespace {

void Enqueue(const std::shared_ptr<AgentClient>& self, AgentClient::Impl* impl, std::string frame);

// `bytes` of counted frames left the queue (written or dropped): wakes waiting uploads.
void Dequeued(AgentClient::Impl* impl, uint64_t bytes) {
  if (bytes == 0) return;
  {
    MutexLock l(impl->room_mu);
    impl->queued -= bytes;
  }
  impl->room_cv.NotifyAll();
}

}  // namespace

uint32_t AgentClient::StartCall(const Json& request, std::shared_ptr<Call> call) {
  return StartCall(request.dump(-1, ' ', false, Json::error_handler_t::replace), std::move(call));
}

uint32_t AgentClient::StartCall(std::string request, std::shared_ptr<Call> call) {
  uint32_t ch = next_channel_.fetch_add(1);
  if (ch == 0) ch = next_channel_.fetch_add(1);
  std::string frame = protocol::EncodeFrameOrDie(FrameType::kRequest, 0, ch, request);
  impl_->queued += frame.size();
  auto self = shared_from_this();
  asio::dispatch(impl_->strand,
                 [self, ch, call = std::move(call), frame = std::move(frame)]() mutable {
                   auto* impl = self->impl_.get();
                   if (impl->shut) {
                     Dequeued(impl, frame.size());
                     call->OnResponse(Unavailable("sandbox agent connection is closed"));
                     return;
                   }
                   impl->calls[ch] = std::move(call);
                   Enqueue(self, impl, std::move(frame));
                 });
  return ch;
}

void AgentClient::SendData(uint32_t channel, uint8_t stream, std::string data, bool eof) {
  // Framed here, so that the queue's byte count covers them before the strand runs.
  std::vector<std::string> frames;
  uint64_t bytes = 0;
  std::string_view rest = data;
  do {
    size_t n = std::min(rest.size(), protocol::kDataChunk);
    bool last = n == rest.size();
    uint8_t flags = static_cast<uint8_t>(stream | (last && eof ? protocol::kFlagEof : 0));
    frames.push_back(
        protocol::EncodeFrameOrDie(FrameType::kData, flags, channel, rest.substr(0, n)));
    bytes += frames.back().size();
    rest.remove_prefix(n);
  } while (!rest.empty());
  impl_->queued += bytes;
  auto self = shared_from_this();
  asio::dispatch(impl_->strand, [self, frames = std::move(frames), bytes]() mutable {
    auto* impl = self->impl_.get();
    if (impl->shut) return Dequeued(impl, bytes);
    for (auto& f : frames) Enqueue(self, impl, std::move(f));
  });
}

void AgentClient::SendControl(uint32_t channel, const Json& control) {
  std::string frame = protocol::EncodeFrameOrDie(FrameType::kControl, 0, channel, control.dump());
  impl_->queued += frame.size();
  auto self = shared_from_this();
  asio::dispatch(impl_->strand, [self, frame = std::move(frame)]() mutable {
    if (self->impl_->shut) return Dequeued(self->impl_.get(), frame.size());
    Enqueue(self, self->impl_.get(), std::move(frame));
  });
}

void AgentClient::Close() {
  closed_ = true;
  auto self = shared_from_this();
  asio::dispatch(impl_->strand, [self]() {
    auto* impl = self->impl_.get();
    if (impl->shut) return;
    impl->shut = true;
    boost::system::error_code ec;
    impl->socket.close(ec);
    auto calls = std::move(impl->calls);
    impl->calls.clear();
    uint64_t dropped = 0;
    for (const auto& f : impl->wqueue) dropped += f.size();
    impl->wqueue.clear();
    Dequeued(impl, dropped);
    for (auto& [ch, call] : calls) call->OnResponse(Unavailable("sandbox agent connection lost"));
    if (impl->on_closed) {
      auto cb = std::move(impl->on_closed);
      impl->on_closed = nullptr;
      cb(Unavailable("sandbox agent connection lost"));
    }
  });
}

namespace {

void WriteNext(std::shared_ptr<AgentClient> self, AgentClient::Impl* impl);

void Enqueue(const std::shared_ptr<AgentClient>& self, AgentClient::Impl* impl, std::string frame) {
  impl->wqueue.push_back(std::move(frame));
  if (!impl->writing) WriteNext(self, impl);
}

void WriteNext(std::shared_ptr<AgentClient> self, AgentClient::Impl* impl) {
  if (impl->wqueue.empty() || impl->shut) {
    impl->writing = false;
    return;
  }
  impl->writing = true;
  // Coalesce small frames into one write.
  if (impl->wqueue.size() > 1 && impl->wqueue.front().size() < 64 * 1024) {
    std::string merged;
    while (!impl->wqueue.empty() && merged.size() < 256 * 1024) {
      merged += impl->wqueue.front();
      impl->wqueue.pop_front();
    }
    impl->wqueue.push_front(std::move(merged));
  }
  asio::async_write(
      impl->socket, asio::buffer(impl->wqueue.front()),
      asio::bind_executor(impl->strand, [self, impl](boost::system::error_code ec, size_t) {
        if (ec) {
          impl->writing = false;
          self->Close();
          return;
        }
        if (!impl->wqueue.empty()) {
          uint64_t written = impl->wqueue.front().size();
          impl->wqueue.pop_front();
          Dequeued(impl, written);
        }
        WriteNext(self, impl);
      }));
}

// Collects a call's body data in a buffer of its own (the caller may give up waiting and go
// away) and hands it over with the response.
class SyncCall : public AgentClient::Call {
 public:
  struct Result {
    StatusOr<Json> response = InternalError("no response");
    std::string data;
  };
  explicit SyncCall(uint64_t max) : max_(max) {}
  void OnData(uint8_t, std::string_view data) override {
    size_t room = data_.size() >= max_ ? 0 : max_ - data_.size();
    data_.append(data.substr(0, std::min(room, data.size())));
  }
  void OnResponse(StatusOr<Json> r) override {
    promise_.set_value(Result{std::move(r), std::move(data_)});
  }
  std::future<Result> future() { return promise_.get_future(); }

 private:
  uint64_t max_;
  std::string data_;
  std::promise<Result> promise_;
};

}  // namespace

void AgentClient::Abandon(uint32_t channel) {
  auto self = shared_from_this();
  asio::dispatch(impl_->strand, [self, channel]() { self->impl_->calls.erase(channel); });
}

StatusOr<Json> AgentClient::CallSync(const Json& request, std::string_view upload,
                                     std::string* download, uint64_t max_download, bool has_upload,
                                     int64_t timeout_ms) {
  auto call = std::make_shared<SyncCall>(download ? max_download : 0);
  auto fut = call->future();
  uint32_t ch = StartCall(request, call);
  if (has_upload) SendData(ch, protocol::kBody, std::string(upload), /*eof=*/true);
  if (fut.wait_for(std::chrono::milliseconds(timeout_ms)) != std::future_status::ready) {
    Abandon(ch);
    return DeadlineExceeded("the sandbox agent did not answer within " +
                            std::to_string(timeout_ms) + " ms");
  }
  SyncCall::Result r = fut.get();
  if (download) *download = std::move(r.data);
  return std::move(r.response);
}

namespace {

class StreamCall : public AgentClient::Call {
 public:
  StreamCall(std::function<Status(std::string_view)> sink, std::weak_ptr<AgentClient> client)
      : sink_(std::move(sink)), client_(std::move(client)) {}
  void set_channel(uint32_t ch) { channel_ = ch; }
  void OnData(uint8_t, std::string_view data) override {
    bool stop = false;
    {
      MutexLock l(mu_);
      if (!active_ || !sunk_.ok()) return;
      sunk_ = sink_(data);
      stop = !sunk_.ok();
    }
    if (stop) Close();
  }
  void OnResponse(StatusOr<Json> r) override {
    MutexLock l(mu_);
    promise_.set_value(sunk_.ok() ? std::move(r) : StatusOr<Json>(sunk_));
  }
  std::future<StatusOr<Json>> future() { return promise_.get_future(); }
  // The caller gave up: no sink call runs once this returns; the agent is asked to stop.
  void Deactivate() {
    {
      MutexLock l(mu_);
      active_ = false;
    }
    Close();
  }

 private:
  void Close() {
    if (auto c = client_.lock()) c->SendControl(channel_, {{"close", true}});
  }
  std::function<Status(std::string_view)> sink_;
  std::weak_ptr<AgentClient> client_;
  std::atomic<uint32_t> channel_{0};
  Mutex mu_;
  bool active_ DSEC_GUARDED_BY(mu_) = true;
  Status sunk_ DSEC_GUARDED_BY(mu_) = OkStatus();
  std::promise<StatusOr<Json>> promise_;
};

}  // namespace

StatusOr<Json> AgentClient::CallSyncStream(const Json& request,
                                           std::function<Status(std::string_view)> sink,
                                           int64_t timeout_ms) {
  auto call = std::make_shared<StreamCall>(std::move(sink), weak_from_this());
  auto fut = call->future();
  call->set_channel(StartCall(request, call));
  if (fut.wait_for(std::chrono::milliseconds(timeout_ms)) != std::future_status::ready) {
    call->Deactivate();
    return DeadlineExceeded("the sandbox agent did not finish within " +
                            std::to_string(timeout_ms) + " ms");
  }
  return fut.get();
}

StatusOr<Json> AgentClient::CallSyncUpload(const Json& request, int fd, uint64_t offset,
                                           uint64_t size, int64_t timeout_ms) {
  auto call = std::make_shared<SyncCall>(0);
  auto fut = call->future();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  uint32_t ch = StartCall(request, call);
  uint64_t sent = 0;
  bool stopped = false;  // the deadline passed, the connection went or the agent answered
  Status read = ReadFileChunks(
      fd, size, 1 << 20,
      [&](std::string_view piece) -> Status {
        // Room in the outgoing queue, or the connection is gone (the call then fails with it).
        MutexLock l(impl_->room_mu);
        bool room = impl_->room_cv.WaitUntil(
            l, deadline, [&] { return impl_->queued.load() < kUploadWindow || closed_.load(); });
        l.Unlock();
        // Refused early (the agent answered): the rest is not needed.
        if (!room || closed_.load() ||
            fut.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
          stopped = true;
          return Status(StatusCode::kAborted, "upload stopped");
        }
        sent += piece.size();
        SendData(ch, protocol::kBody, std::string(piece), /*eof=*/sent == size);
        return OkStatus();
      },
      "the spooled upload", offset);
  // An empty body, or one that could not be read to its end: the body ends where it is (the
  // caller is told the upload failed).
  if (!stopped && (size == 0 || !read.ok())) SendData(ch, protocol::kBody, {}, /*eof=*/true);
  if (fut.wait_until(deadline) != std::future_status::ready) {
    Abandon(ch);
    return DeadlineExceeded("the sandbox agent did not take the upload within " +
                            std::to_string(timeout_ms) + " ms");
  }
  SyncCall::Result r = fut.get();
  if (!stopped && !read.ok() && r.response.ok())
    return InternalError(read.message() + "; the sandbox holds a partial copy");
  return std::move(r.response);
}

struct IoRunner::Impl {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> guard{io.get_executor()};
  std::vector<std::thread> threads;
};

IoRunner::IoRunner(int threads) : impl_(std::make_unique<Impl>()) {
  for (int i = 0; i < threads; ++i) impl_->threads.emplace_back([this] { impl_->io.run(); });
}

IoRunner::~IoRunner() {
  impl_->guard.reset();
  impl_->io.stop();
  for (auto& t : impl_->threads) t.join();
}

asio::io_context& IoRunner::io() { return impl_->io; }

bool IoRunner::OnIoThread() const {
  for (const auto& t : impl_->threads)
    if (t.get_id() == std::this_thread::get_id()) return true;
  return false;
}

}  // namespace dsec::backends
