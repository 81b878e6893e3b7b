#include "apiserver/view.h"

#include <chrono>
#include <set>

#include "base/clock.h"
#include "base/logging.h"
#include "base/strings.h"

namespace dsec::apiserver {

std::string NodeState::State() const {
  if (!alive) return "unavailable";
  if (cordon == "drain") return "draining";
  if (!cordon.empty()) return "cordoned";
  return "ready";
}

ClusterView::ClusterView(etcd::Client* etcd, AccessView* access, Quotas* quotas)
    : etcd_(etcd), access_(access), quotas_(quotas) {}

ClusterView::~ClusterView() { Stop(); }

void ClusterView::Start() {
  thread_ = std::thread([this] { Run(); });
}

void ClusterView::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

std::vector<NodeState> ClusterView::Nodes() const { return *NodesView(); }

std::shared_ptr<const std::vector<NodeState>> ClusterView::NodesView() const {
  MutexLock l(mu_);
  if (view_) return view_;
  auto out = std::make_shared<std::vector<NodeState>>();
  out->reserve(nodes_.size());
  for (const auto& [name, n] : nodes_) {
    out->push_back(n);
    auto c = cordons_.find(name);
    out->back().cordon = c == cordons_.end() ? "" : c->second;
    if (auto ls = layers_.find(name); ls != layers_.end()) out->back().layers = ls->second;
  }
  view_ = std::move(out);
  return view_;
}

std::vector<cluster::ClusterImage> ClusterView::Images() const {
  MutexLock l(mu_);
  std::vector<cluster::ClusterImage> out;
  for (const auto& [name, img] : images_) out.push_back(img);
  return out;
}

std::optional<cluster::ClusterImage> ClusterView::Image(const std::string& name) const {
  MutexLock l(mu_);
  auto it = images_.find(name);
  if (it == images_.end()) return std::nullopt;
  return it->second;
}

std::optional<NodeState> ClusterView::Find(const std::string& node) const {
  MutexLock l(mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return std::nullopt;
  NodeState n = it->second;
  auto c = cordons_.find(node);
  n.cordon = c == cordons_.end() ? "" : c->second;
  if (auto ls = layers_.find(node); ls != layers_.end()) n.layers = ls->second;
  return n;
}

void ClusterView::ApplyPut(const std::string& key, const std::string& value) {
  if (quotas_ && Quotas::Owns(key)) return quotas_->ApplyPut(key, value);
  if (access_ && (StartsWith(key, kProjectsPrefix) || StartsWith(key, kTokensPrefix) ||
                  StartsWith(key, kTokenUsedPrefix)))
    return access_->ApplyPut(key, value);
  if (StartsWith(key, cluster::kCordonPrefix)) {
    MutexLock l(mu_);
    cordons_[key.substr(cluster::kCordonPrefix.size())] = value == "drain" ? "drain" : "cordon";
    view_.reset();
    return;
  }
  if (StartsWith(key, cluster::kImagesPrefix)) {
    auto img = cluster::ClusterImage::FromJson(value);
    MutexLock l(mu_);
    if (img.ok())
      images_[key.substr(cluster::kImagesPrefix.size())] = std::move(*img);
    else
      DSEC_LOG_WARN("view: ignoring a bad image record at {}", key);
    return;
  }
  if (StartsWith(key, cluster::kLayersPrefix)) {
    auto h = cluster::LayerHolders::FromJson(value);
    MutexLock l(mu_);
    layers_[key.substr(cluster::kLayersPrefix.size())] =
        std::make_shared<const std::vector<std::string>>(h.ok() ? std::move(h->layers)
                                                                : std::vector<std::string>{});
    view_.reset();
    return;
  }
  if (!StartsWith(key, cluster::kNodesPrefix)) return;
  auto rec = cluster::NodeRecord::FromJson(value);
  const std::string name = key.substr(cluster::kNodesPrefix.size());
  if (!rec.ok() || rec->node != name) {
    DSEC_LOG_WARN("view: ignoring a bad node record at {}", key);
    return;
  }
  std::string host;
  uint16_t port = 0;
  if (!http::ParseHttpUrl(rec->url, &host, &port).ok()) {
    DSEC_LOG_WARN("view: node {} has a bad url \"{}\"", name, rec->url);
    return;
  }
  MutexLock l(mu_);
  view_.reset();
  NodeState& n = nodes_[name];
  if (!n.client || n.client->host() != host || n.client->port() != port)
    n.client = std::make_shared<http::HttpClient>(host, port, 64);
  for (auto [url, c] : {std::pair{&rec->e2b_url, &n.e2b_client},
                        std::pair{&rec->sandbox_fusion_url, &n.fusion_client}}) {
    std::string h;
    uint16_t p = 0;
    if (url->empty() || !http::ParseHttpUrl(*url, &h, &p).ok())
      c->reset();
    else if (!*c || (*c)->host() != h || (*c)->port() != p)
      *c = std::make_shared<http::HttpClient>(h, p, 64);
  }
  if (!n.inflight) n.inflight = std::make_shared<std::atomic<int64_t>>(0);
  if (!n.inflight_mb) n.inflight_mb = std::make_shared<std::atomic<int64_t>>(0);
  if (!n.alive) {
    n.changed_ms = WallMs();
    DSEC_LOG_INFO("view: node {} is up at {}", name, rec->url);
  }
  n.alive = true;
  n.rec = std::move(*rec);
}

void ClusterView::ApplyDelete(const std::string& key) {
  if (quotas_ && Quotas::Owns(key)) return quotas_->ApplyDelete(key);
  if (access_ && (StartsWith(key, kProjectsPrefix) || StartsWith(key, kTokensPrefix) ||
                  StartsWith(key, kTokenUsedPrefix)))
    return access_->ApplyDelete(key);
  MutexLock l(mu_);
  view_.reset();
  if (StartsWith(key, cluster::kCordonPrefix)) {
    cordons_.erase(key.substr(cluster::kCordonPrefix.size()));
    return;
  }
  if (StartsWith(key, cluster::kImagesPrefix)) {
    images_.erase(key.substr(cluster::kImagesPrefix.size()));
    return;
  }
  if (StartsWith(key, cluster::kLayersPrefix)) {
    layers_.erase(key.substr(cluster::kLayersPrefix.size()));
    return;
  }
  if (!StartsWith(key, cluster::kNodesPrefix)) return;
  auto it = nodes_.find(key.substr(cluster::kNodesPrefix.size()));
  if (it == nodes_.end() || !it->second.alive) return;
  it->second.alive = false;
  it->second.changed_ms = WallMs();
  DSEC_LOG_WARN("view: node {} is unavailable (its lease lapsed or it left)", it->first);
}

void ClusterView::Reset(const std::vector<etcd::KeyValue>& kvs) {
  if (access_) access_->Reset(kvs);
  if (quotas_) quotas_->Reset(kvs);
  std::set<std::string> present;
  for (const auto& kv : kvs) {
    if (quotas_ && Quotas::Owns(kv.key)) continue;
    if (access_ && (StartsWith(kv.key, kProjectsPrefix) || StartsWith(kv.key, kTokensPrefix) ||
                    StartsWith(kv.key, kTokenUsedPrefix)))
      continue;
    ApplyPut(kv.key, kv.value);
    present.insert(kv.key);
  }
  std::vector<std::string> gone;
  {
    MutexLock l(mu_);
    for (const auto& [name, n] : nodes_)
      if (!present.count(std::string(cluster::kNodesPrefix) + name)) gone.push_back(name);
    for (auto it = cordons_.begin(); it != cordons_.end();)
      it = present.count(std::string(cluster::kCordonPrefix) + it->first) ? std::next(it)
                                                                          : cordons_.erase(it);
    std::erase_if(images_,
                  [&](const auto& kv) { return !present.count(cluster::ImageKey(kv.first)); });
    std::erase_if(layers_,
                  [&](const auto& kv) { return !present.count(cluster::LayersKey(kv.first)); });
    view_.reset();
  }
  for (const auto& name : gone) ApplyDelete(std::string(cluster::kNodesPrefix) + name);
}

void ClusterView::Run() {
  auto backoff = std::chrono::milliseconds(100);
  bool warned = false;
  while (!stop_) {
    int64_t revision = 0;
    auto kvs = etcd_->RangePrefix(std::string(cluster::kPrefix), &revision);
    if (!kvs.ok()) {
      etcd_ok_ = false;
      if (stale_since_ms_.load() == 0) stale_since_ms_ = WallMs();
      if (!warned) DSEC_LOG_WARN("view: etcd unreachable: {}", kvs.status().message());
      warned = true;
      for (auto until = std::chrono::steady_clock::now() + backoff;
           !stop_ && std::chrono::steady_clock::now() < until;)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
      continue;
    }
    Reset(*kvs);
    if (quotas_) quotas_->SetRevision(revision);
    loaded_ = true;
    etcd_ok_ = true;
    stale_since_ms_ = 0;
    if (warned) DSEC_LOG_INFO("view: etcd is back (revision {})", revision);
    warned = false;
    backoff = std::chrono::milliseconds(100);
    Status s = etcd_->Watch(
        std::string(cluster::kPrefix), revision + 1,
        [this](const std::vector<etcd::Event>& events, int64_t revision) {
          for (const auto& e : events) {
            if (e.deleted)
              ApplyDelete(e.kv.key);
            else
              ApplyPut(e.kv.key, e.kv.value);
          }
          if (quotas_) quotas_->SetRevision(revision);
        },
        &stop_);
    if (stop_) break;
    etcd_ok_ = false;
    if (stale_since_ms_.load() == 0) stale_since_ms_ = WallMs();
    DSEC_LOG_WARN("view: etcd watch ended: {}", s.message());
    warned = true;
  }
}

}  // namespace dsec::apiserver
