#include "cluster/membership.h"

#include <chrono>

#include "base/logging.h"
#include "cluster/image_record.h"

namespace dsec::cluster {

namespace {
using Clock = std::chrono::steady_clock;
constexpr auto kLoadInterval = std::chrono::milliseconds(250);
constexpr auto kTick = std::chrono::milliseconds(50);
}  // namespace

Membership::Membership(std::vector<std::string> etcd, int64_t ttl_s,
                       std::function<NodeRecord()> record, std::function<NodeUsage()> usage,
                       std::function<std::string()> layers)
    : etcd_(std::move(etcd), std::chrono::milliseconds(std::max<int64_t>(500, ttl_s * 1000 / 4))),
      ttl_s_(ttl_s),
      record_(std::move(record)),
      usage_(std::move(usage)),
      layers_(std::move(layers)) {}

Membership::~Membership() { Stop(); }

void Membership::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Membership::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  thread_.join();
}

void Membership::Finish() {
  if (usage_key_.empty()) return;
  NodeUsage u = usage_();
  Status s = u.entries.empty() ? etcd_.Delete(usage_key_)
                               : etcd_.Put(usage_key_, u.ToJson().dump()).status();
  if (!s.ok()) DSEC_LOG_WARN("cluster: the last usage was not written: {}", s.message());
}

void Membership::Run() {
  const auto keepalive_every = std::chrono::milliseconds(ttl_s_ * 1000 / 3);
  int64_t lease = 0;
  std::string key, published, usage_published, layers_key, layers_published;
  // The usage key, when its text changed (no lease: it outlives a lapse of the record's).
  auto put_usage = [&] {
    NodeUsage u = usage_();
    std::string text = u.ToJson().dump();
    if (text != usage_published && etcd_.Put(usage_key_, text).ok())
      usage_published = std::move(text);
  };
  Clock::time_point last_keepalive{}, last_put{};
  auto backoff = std::chrono::milliseconds(200);
  bool warned = false;
  while (!stop_) {
    const auto now = Clock::now();
    if (lease == 0) {
      NodeRecord rec = record_();
      key = std::string(kNodesPrefix) + rec.node;
      layers_key = LayersKey(rec.node);
      usage_key_ = std::string(kUsagePrefix) + rec.node;
      auto granted = etcd_.LeaseGrant(ttl_s_);
      Status put =
          granted.ok() ? etcd_.Put(key, rec.ToJson().dump(), *granted).status() : granted.status();
      if (!put.ok()) {
        if (granted.ok()) (void)etcd_.LeaseRevoke(*granted);
        if (!warned) DSEC_LOG_WARN("cluster: cannot register in etcd: {}", put.message());
        warned = true;
        registered_ = false;
        for (auto until = Clock::now() + backoff; !stop_ && Clock::now() < until;)
          std::this_thread::sleep_for(kTick);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
        continue;
      }
      lease = *granted;
      published = rec.ToJson().dump();
      usage_published.clear();  // (a restarted edge's key says what the last one left)
      put_usage();
      layers_published.clear();
      last_keepalive = last_put = Clock::now();
      backoff = std::chrono::milliseconds(200);
      warned = false;
      registered_ = true;
      DSEC_LOG_INFO("cluster: registered as {} ({}) under lease {:x}", rec.node, rec.url, lease);
      continue;
    }
    if (now - last_keepalive >= keepalive_every) {
      auto ttl = etcd_.LeaseKeepAlive(lease);
      if (ttl.ok()) {
        last_keepalive = now;
      } else if (ttl.status().code() == StatusCode::kNotFound) {
        DSEC_LOG_WARN("cluster: lease lapsed; registering again");
        lease = 0;
        registered_ = false;
        continue;
      } else if (now - last_keepalive > std::chrono::seconds(ttl_s_)) {
        // etcd has been out of reach for longer than the lease: it is gone there.
        if (!warned) DSEC_LOG_WARN("cluster: etcd unreachable: {}", ttl.status().message());
        warned = true;
        lease = 0;
        registered_ = false;
        continue;
      }
    }
    if (now - last_put >= kLoadInterval) {
      // The record and the usage, whichever changed, in one write (one revision).
      std::string text = record_().ToJson().dump();
      std::string usage = usage_().ToJson().dump();
      std::vector<etcd::Client::TxnPut> puts;
      if (text != published) puts.push_back({key, text, lease});
      if (usage != usage_published) puts.push_back({usage_key_, usage, 0});
      std::string layers = layers_ ? layers_() : std::string();
      if (layers_ && layers != layers_published) puts.push_back({layers_key, layers, lease});
      int64_t revision = 0;
      if (!puts.empty()) {
        if (etcd_.TxnAt({}, puts, {}, &revision).ok()) {
          published = std::move(text);
          usage_published = std::move(usage);
          layers_published = std::move(layers);
        }
        last_put = now;
      }
    }
    std::this_thread::sleep_for(kTick);
  }
  if (lease != 0) {
    (void)etcd_.LeaseRevoke(lease);
    DSEC_LOG_INFO("cluster: left (lease {:x} revoked)", lease);
  }
  registered_ = false;
}

}  // namespace dsec::cluster
