// dsec-standin: a node stand-in for bench/cluster_scale (issue 38), a load generator's part and
// never the product's. It registers in etcd exactly as an edge does (cluster::Membership: the
// node record under a lease, its load, its usage for the cluster's quotas) and serves the part
// of the node API a placed create uses: POST /v1/sandboxes answers a sandbox record after a
// configurable service time (no sandbox is made), DELETE /v1/sandboxes/<id> forgets it, GET
// /v1/health and /v1/node. It checks the node token and the quota room an apiserver admitted
// (Dsec-Quota) as an edge does, so the apiserver's whole create path is exercised.
//
//   dsec-standin --node n17 --listen 127.0.0.1:PORT --etcd http://127.0.0.1:2379
//                   --token-file F [--service-ms 0] [--max-sandboxes 5000] [--lease-ttl 10]
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>

#include "api/quota_room.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/ids.h"
#include "base/json.h"
#include "base/logging.h"
#include "base/mutex.h"
#include "base/strings.h"
#include "cluster/membership.h"
#include "http/auth.h"
#include "http/server.h"

namespace dsec {
namespace {

struct Options {
  std::string node, listen, etcd, token_file;
  int64_t service_ms = 0;
  int64_t max_sandboxes = 5000;
  int64_t memory_mb = 1 << 20;
  int64_t lease_ttl_s = 10;
};

struct Sandbox {
  std::string project, owner, hold;
  int64_t memory_mb = 0, cpu_milli = 0;
};

class Standin {
 public:
  explicit Standin(Options o) : o_(std::move(o)), gen_(WallMs() * 1000) {}

  cluster::NodeRecord Record() {
    cluster::NodeRecord r;
    r.node = o_.node;
    r.url = "http://" + o_.listen;
    r.instance = "standin-" + o_.node;
    r.version = "standin";
    r.kinds = {"container"};
    r.max_sandboxes = o_.max_sandboxes;
    r.memory_mb = o_.memory_mb;
    r.admit_memory_mb = o_.memory_mb;
    r.max_memory_mb = o_.memory_mb;
    r.default_memory_mb = 512;
    r.default_cpu_milli = 1000;
    r.started_at = started_;
    MutexLock l(mu_);
    r.sandboxes = static_cast<int64_t>(sandboxes_.size());
    r.used_memory_mb = used_mb_;
    return r;
  }

  cluster::NodeUsage Usage() {
    MutexLock l(mu_);
    cluster::NodeUsage u;
    u.gen = gen_;
    for (const auto& [k, e] : usage_) {
      if (e.sandboxes == 0) continue;
      u.entries.push_back(e);
      std::tie(u.entries.back().project, u.entries.back().owner, u.entries.back().hold) = k;
    }
    return u;
  }

  void Handle(http::HttpRequest&& req, std::shared_ptr<http::Responder> res) {
    auto reply = [&](int status, const Json& body, http::Headers h = {}) {
      http::HttpResponse r;
      r.status = status;
      r.body = status == 204 ? "" : body.dump();
      r.headers = std::move(h);
      res->Send(std::move(r));
    };
    if (req.method == "GET" && req.path == "/v1/health") return reply(200, {{"status", "ok"}});
    if (!http::ConstantTimeEquals(http::BearerToken(req), token_))
      return res->Send(http::JsonError(401, "unauthorized", "invalid token"));
    if (req.method == "GET" && req.path == "/v1/node") return reply(200, Record().ToJson());
    if (req.method == "POST" && req.path == "/v1/sandboxes") return Create(req, std::move(res));
    if (req.method == "DELETE" && StartsWith(req.path, "/v1/sandboxes/")) {
      std::string id = req.path.substr(14);
      MutexLock l(mu_);
      auto it = sandboxes_.find(id);
      if (it == sandboxes_.end())
        return res->Send(http::JsonError(404, "not_found", "sandbox " + id + " not found"));
      Forget(it);
      return reply(204, nullptr);
    }
    res->Send(http::JsonError(404, "not_found", "a stand-in serves no " + req.path));
  }

  void Create(const http::HttpRequest& req, std::shared_ptr<http::Responder> res) {
    Json b = Json::parse(req.body, nullptr, false);
    if (!b.is_object()) return res->Send(http::JsonError(400, "bad_request", "not JSON"));
    const int64_t n = b.value("count", int64_t{1});
    const int64_t mb = b.value("memory_mb", int64_t{512});
    const int64_t cpu = static_cast<int64_t>(b.value("cpu", 1.0) * 1000 + 0.5);
    const bool list = b.contains("count");
    std::string hold;
    if (std::string q = req.Header("dsec-quota"); !q.empty()) {
      auto room = api::ParseQuotaRoom(q, /*with_hold=*/true);
      if (!room.ok())
        return res->Send(http::JsonError(400, "bad_request", room.status().message()));
      if (n > room->sandboxes || n * mb > room->memory_mb || n * cpu > room->cpu_milli) {
        http::HttpResponse r = http::JsonError(409, "conflict", "more than the quota room");
        r.headers.emplace_back(
            "Dsec-Quota-Need",
            api::QuotaRoomText({.sandboxes = n, .memory_mb = n * mb, .cpu_milli = n * cpu}));
        return res->Send(std::move(r));
      }
      hold = room->hold;
    }
    std::string project = req.Header("dsec-project");
    if (project.empty()) project = "default";
    Json made = Json::array();
    int64_t gen = 0;
    {
      MutexLock l(mu_);
      if (static_cast<int64_t>(sandboxes_.size()) + n > o_.max_sandboxes) {
        http::HttpResponse r = http::JsonError(429, "over_capacity", "the stand-in is full");
        r.headers.emplace_back("Retry-After", "1");
        return res->Send(std::move(r));
      }
      const int64_t now = WallMs();
      for (int64_t i = 0; i < n; ++i) {
        std::string id = NewSandboxId(o_.node);
        Sandbox s{project, req.Header("dsec-owner"), hold, mb, cpu};
        auto& u = usage_[{s.project, s.owner, s.hold}];
        u.sandboxes++;
        u.memory_mb += mb;
        u.cpu_milli += cpu;
        used_mb_ += mb;
        sandboxes_.emplace(id, std::move(s));
        made.push_back({{"id", id},
                        {"kind", "container"},
                        {"state", "running"},
                        {"node", o_.node},
                        {"image", "host"},
                        {"project", project},
                        {"created_at", now},
                        {"expires_at", now + 3600000},
                        {"cpu", cpu / 1000.0},
                        {"memory_mb", mb}});
      }
      gen = ++gen_;
    }
    http::HttpResponse r;
    r.status = 201;
    r.body = list ? Json{{"sandboxes", made}}.dump() : made[0].dump();
    r.headers.emplace_back("Dsec-Usage-Gen", std::to_string(gen));
    if (o_.service_ms <= 0) return res->Send(std::move(r));
    auto t = std::make_shared<boost::asio::steady_timer>(timers_,
                                                         std::chrono::milliseconds(o_.service_ms));
    t->async_wait([t, res, r = std::move(r)](const boost::system::error_code&) mutable {
      res->Send(std::move(r));
    });
  }

  int Run() {
    auto tokens = ReadFileToString(o_.token_file);
    if (!tokens.ok()) {
      std::fprintf(stderr, "dsec-standin: %s\n", tokens.status().message().c_str());
      return 2;
    }
    token_ = std::string(TrimWhitespace(*tokens));
    started_ = WallMs();
    http::HttpServerOptions ho;
    ho.listen = o_.listen;
    ho.io_threads = 1;
    ho.max_connections = 4096;
    auto server = http::HttpServer::Start(
        ho,
        [](http::HttpRequest&) {
          http::Preflight pf;
          pf.body_limit = 1 << 20;
          return pf;
        },
        [this](http::HttpRequest&& r, std::shared_ptr<http::Responder> res) {
          Handle(std::move(r), std::move(res));
        });
    if (!server.ok()) {
      std::fprintf(stderr, "dsec-standin: %s\n", server.status().message().c_str());
      return 1;
    }
    auto work = boost::asio::make_work_guard(timers_);
    std::thread timer_thread([this] { timers_.run(); });
    cluster::Membership m(
        {o_.etcd}, o_.lease_ttl_s, [this] { return Record(); }, [this] { return Usage(); });
    m.Start();
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    int sig = 0;
    sigwait(&set, &sig);
    m.Stop();  // (the lease revoked: gone from placement at once)
    (*server)->Stop();
    work.reset();
    timers_.stop();
    timer_thread.join();
    return 0;
  }

 private:
  void Forget(std::map<std::string, Sandbox>::iterator it) DSEC_REQUIRES(mu_) {
    auto& u = usage_[{it->second.project, it->second.owner, it->second.hold}];
    u.sandboxes--;
    u.memory_mb -= it->second.memory_mb;
    u.cpu_milli -= it->second.cpu_milli;
    used_mb_ -= it->second.memory_mb;
    sandboxes_.erase(it);
    ++gen_;
  }

  Options o_;
  std::string token_;
  int64_t started_ = 0;
  boost::asio::io_context timers_;
  Mutex mu_;
  std::map<std::string, Sandbox> sandboxes_ DSEC_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, std::string, std::string>, cluster::UsageEntry> usage_
      DSEC_GUARDED_BY(mu_);
  int64_t used_mb_ DSEC_GUARDED_BY(mu_) = 0;
  int64_t gen_ DSEC_GUARDED_BY(mu_);
};

}  // namespace
}  // namespace dsec

int main(int argc, char** argv) {
  dsec::Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--node")
      o.node = v;
    else if (k == "--listen")
      o.listen = v;
    else if (k == "--etcd")
      o.etcd = v;
    else if (k == "--token-file")
      o.token_file = v;
    else if (k == "--service-ms")
      o.service_ms = std::stoll(v);
    else if (k == "--max-sandboxes")
      o.max_sandboxes = std::stoll(v);
    else if (k == "--lease-ttl")
      o.lease_ttl_s = std::stoll(v);
    else {
      std::fprintf(stderr, "dsec-standin: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (o.node.empty() || o.listen.empty() || o.etcd.empty() || o.token_file.empty()) {
    std::fprintf(stderr,
                 "usage: dsec-standin --node N --listen H:P --etcd URL --token-file F "
                 "[--service-ms MS] [--max-sandboxes N] [--lease-ttl S]\n");
    return 2;
  }
  // The signals the main thread waits for, blocked before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  dsec::log::Init("warn");
  return dsec::Standin(o).Run();
}
