#include "edge/cluster_images.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <set>

#include "base/clock.h"
#include "base/file_util.h"
#include "base/logging.h"
#include "base/strings.h"
#include "cluster/node_record.h"
#include "edge/metrics.h"
#include "http/client.h"

namespace dsec::edge {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A cached image used this recently is not evicted (a create may be between finding it and
// holding its layers).
constexpr int64_t kRecentMs = 10000;

std::string HexOf(const unsigned char* p, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out += kHex[p[i] >> 4];
    out += kHex[p[i] & 15];
  }
  return out;
}

// Waits for room on socket `fd`: at most `idle`, in slices that look at *stop.
bool Writable(int fd, milliseconds idle, const std::atomic<bool>& stop) {
  for (auto until = Clock::now() + idle; !stop && Clock::now() < until;) {
    pollfd p{fd, POLLOUT, 0};
    int n = poll(&p, 1, 200);
    if (n > 0) return (p.revents & (POLLERR | POLLHUP)) == 0;
    if (n < 0 && errno != EINTR) return false;
  }
  return false;
}

// Writes all of `data` to the non-blocking socket `fd`, waiting at most `idle` for room.
Status SendAll(int fd, std::string_view data, milliseconds idle, const std::atomic<bool>& stop) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN) return ErrnoError("send");
    if (!Writable(fd, idle, stop)) return Unavailable("the peer takes nothing");
  }
  return OkStatus();
}

bool SameLayers(const images::Image& local, const cluster::ClusterImage& rec) {
  if (local.layers.size() != rec.layers.size() || local.base != rec.base ||
      local.project != rec.project)
    return false;
  for (size_t i = 0; i < rec.layers.size(); ++i)
    if (local.layers[i] != rec.layers[i].digest) return false;
  return true;
}

}  // namespace

ClusterImages::ClusterImages(ClusterImagesOptions o, images::ImageStore* store, Metrics* metrics)
    : o_(std::move(o)), store_(store), metrics_(metrics), etcd_(o_.etcd) {}

ClusterImages::~ClusterImages() { Stop(); }

void ClusterImages::Start() {
  watcher_ = std::thread([this] { Watch(); });
}

void ClusterImages::Stop() {
  stop_ = true;
  if (watcher_.joinable()) watcher_.join();
  while (threads_.load() > 0) std::this_thread::sleep_for(milliseconds(20));
}

void ClusterImages::StartServe(UniqueFd client, std::string digest) {
  threads_.fetch_add(1);
  std::thread([this, fd = std::make_shared<UniqueFd>(std::move(client)), digest] {
    ServeLayer(fd->get(), digest);
    fd->Reset();
    threads_.fetch_sub(1);
  }).detach();
}

Status ClusterImages::CheckName(const std::string& name, const std::string& project) {
  auto kv = etcd_.Get(cluster::ImageKey(name));
  if (!kv.ok()) return Unavailable("the cluster's images cannot be read: " + kv.status().message());
  if (*kv) {
    auto rec = cluster::ClusterImage::FromJson((*kv)->value);
    return Status(
        StatusCode::kAlreadyExists,
        "image \"" + name + "\" already exists" +
            (rec.ok() && rec->project != project ? " in the cluster (image names are the cluster's)"
                                                 : ""));
  }
  return OkStatus();
}

Status ClusterImages::Publish(const images::Image& img) {
  Status st = PublishRecord(img);
  if (st.ok()) return st;
  (void)store_->DeleteImage(img.name);  // not kept here either: the caller may try again
  (void)store_->Collect();
  return st;
}

Status ClusterImages::PublishRecord(const images::Image& img) {
  if (img.project.empty()) return InvalidArgument("a cluster's image belongs to a project");
  cluster::ClusterImage rec;
  rec.name = img.name;
  rec.project = img.project;
  rec.base = img.base;
  rec.config = images::ConfigToJson(img.config);
  rec.source = img.source;
  rec.created_at = img.created_at;
  rec.origin = o_.node;
  for (const auto& d : img.layers) {
    DSEC_ASSIGN_OR_RETURN(images::LayerInfo l, store_->Blob(d));
    rec.layers.push_back({l.digest, l.size, l.blob, l.blob_size});
  }
  const std::string key = cluster::ImageKey(img.name);
  auto put = etcd_.Txn({{key, etcd::Client::Condition::kAbsent, ""}}, {{key, rec.ToJson().dump()}});
  if (!put.ok())
    return Unavailable("the image could not be published to the cluster: " +
                       put.status().message());
  if (!*put)
    return Status(StatusCode::kAlreadyExists,
                  "image \"" + img.name + "\" already exists in the cluster");
  Touch(img.name);
  // (Until marked, the watch leaves it alone: the record it has just seen is this one.)
  return store_->SetPublished(img.name);
}

void ClusterImages::Touch(const std::string& name) {
  MutexLock l(mu_);
  used_[name] = WallMs();
}

Status ClusterImages::Ensure(const std::string& project, const std::vector<std::string>& names) {
  bool fetched = false;
  for (const auto& name : names) {
    if (name == "host" || StartsWith(name, "sha256:")) continue;
    if (store_->GetImage(name).ok()) {
      Touch(name);
      continue;
    }
    auto kv = etcd_.Get(cluster::ImageKey(name));
    if (!kv.ok())
      return Unavailable("image \"" + name +
                         "\": the cluster's images cannot be read: " + kv.status().message());
    if (!*kv) continue;  // not the cluster's: the create says it is not found
    auto rec = cluster::ClusterImage::FromJson((*kv)->value);
    if (!rec.ok()) {
      DSEC_LOG_WARN("cluster images: the record of {} is unreadable: {}", name,
                    rec.status().message());
      continue;
    }
    if (rec->project != project) continue;  // another project's: not found, the same words
    // A layer just fetched is referenced by no image until PutImage: nothing is collected
    // meanwhile.
    images::ImageStore::Lease lease(store_);
    for (const auto& layer : rec->layers) {
      if (store_->GetLayer(layer.digest).ok()) continue;
      DSEC_RETURN_IF_ERROR(Fetch(layer, rec->origin));
      fetched = true;
    }
    images::Image img;
    img.name = rec->name;
    img.base = rec->base;
    for (const auto& layer : rec->layers) img.layers.push_back(layer.digest);
    img.config = images::ConfigFromJson(rec->config);
    img.source = rec->source;
    img.created_at = rec->created_at;
    img.project = rec->project;
    img.cached = true;
    Status put = store_->PutImage(img);
    if (!put.ok() && put.code() != StatusCode::kAlreadyExists) return put;  // (a concurrent create)
    Touch(name);
  }
  if (fetched) Trim();  // (what was used lately stays: this create's images among them)
  return OkStatus();
}

Status ClusterImages::Fetch(const cluster::ClusterLayer& layer, const std::string& origin) {
  std::shared_ptr<Flight> f;
  bool mine = false;
  {
    MutexLock l(mu_);
    auto& slot = flights_[layer.digest];
    if (!slot) {
      slot = std::make_shared<Flight>();
      mine = true;
    }
    f = slot;
    if (!mine) {
      flight_done_.Wait(l, [&]() DSEC_REQUIRES(mu_) { return f->done; });
      return f->result;
    }
  }
  // The holders, in random order (the load spreads), this node left out. A node publishes what
  // it holds within a moment of having it: an image just made may not be listed yet, so its
  // origin is tried too, and an empty list is read again for a few seconds.
  Status result = Unavailable("layer " + layer.digest + ": no node holds it");
  std::vector<std::pair<std::string, std::string>> holders;  // node, url
  StatusOr<std::vector<etcd::KeyValue>> nodes = std::vector<etcd::KeyValue>{};
  for (int attempt = 0; holders.empty() && attempt < 12 && !stop_; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(milliseconds(250));
    int64_t rev = 0;
    auto layers = etcd_.RangePrefix(std::string(cluster::kLayersPrefix), &rev);
    nodes = layers.ok() ? etcd_.RangePrefix(std::string(cluster::kNodesPrefix), &rev)
                        : StatusOr<std::vector<etcd::KeyValue>>(layers.status());
    if (!nodes.ok()) break;
    std::map<std::string, std::string> urls;
    for (const auto& kv : *nodes)
      if (auto r = cluster::NodeRecord::FromJson(kv.value); r.ok()) urls[r->node] = r->url;
    bool origin_listed = false;
    for (const auto& kv : *layers) {
      std::string node = kv.key.substr(cluster::kLayersPrefix.size());
      auto h = cluster::LayerHolders::FromJson(kv.value);
      if (node == o_.node || !h.ok() || !urls.count(node) ||
          !std::binary_search(h->layers.begin(), h->layers.end(), layer.digest))
        continue;
      holders.emplace_back(node, urls[node]);
      origin_listed = origin_listed || node == origin;
    }
    std::shuffle(holders.begin(), holders.end(), std::mt19937_64(std::random_device{}()));
    if (!origin_listed && origin != o_.node && urls.count(origin))
      holders.emplace_back(origin, urls[origin]);  // (last: it may not have it any more)
  }
  if (!nodes.ok()) {
    result = Unavailable("layer " + layer.digest +
                         ": the cluster's holders cannot be read: " + nodes.status().message());
  } else {
    std::vector<std::string> why;
    for (const auto& [node, url] : holders) {
      Status s = FetchFrom(node, url, layer);
      if (s.ok()) {
        result = OkStatus();
        break;
      }
      metrics_->CountLayer("fetch_failed");
      DSEC_LOG_WARN("cluster images: layer {} from {}: {}", layer.digest, node, s.message());
      why.push_back(node + ": " + s.message());
      if (stop_) break;
    }
    if (!result.ok() && !why.empty())
      result = Unavailable("layer " + layer.digest + " could not be fetched (" +
                           JoinStrings(why, "; ") + ")");
  }
  MutexLock l(mu_);
  f->done = true;
  f->result = result;
  flights_.erase(layer.digest);
  flight_done_.NotifyAll();
  return result;
}

Status ClusterImages::FetchFrom(const std::string& node, const std::string& url,
                                const cluster::ClusterLayer& layer) {
  std::string host;
  uint16_t port = 0;
  DSEC_RETURN_IF_ERROR(http::ParseHttpUrl(url, &host, &port));
  http::HttpClient client(host, port, 0);
  const std::string tmp = store_->TempPath("blob");
  UniqueFd out(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!out) return ErrnoError("open \"" + tmp + "\"");
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  if (!md || EVP_DigestInit_ex(md, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(md);
    unlink(tmp.c_str());
    return InternalError("sha256 init failed");
  }
  uint64_t got = 0;
  int status = 0;
  Status write_error;
  Status s = client.Stream(
      "GET", "/v1/layers/" + layer.digest, {{"Authorization", "Bearer " + o_.token}}, "",
      milliseconds(5000), o_.fetch_idle, &stop_, [&](int st, const http::Headers&) { status = st; },
      [&](std::string_view data) {
        if (status != 200) {  // an error's text: not kept, and not long
          got += data.size();
          return got < (64 << 10);
        }
        if (got + data.size() > layer.blob_size) {
          write_error = Unavailable("the peer sends more than the layer's " +
                                    std::to_string(layer.blob_size) + " bytes");
          return false;
        }
        EVP_DigestUpdate(md, data.data(), data.size());
        got += data.size();
        write_error = WriteAllFd(out.get(), data, tmp);
        return write_error.ok();
      });
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(md, digest, &len);
  EVP_MD_CTX_free(md);
  if (s.ok() && status != 200) s = Unavailable("the peer answered " + std::to_string(status));
  if (s.ok()) s = write_error;
  if (s.ok() && got != layer.blob_size)
    s = Unavailable("the peer sent " + std::to_string(got) + " of " +
                    std::to_string(layer.blob_size) + " bytes");
  if (s.ok() && "sha256:" + HexOf(digest, len) != layer.blob)
    s = Unavailable("the blob's sha256 is not the record's: refused");
  if (s.ok() && fsync(out.get()) < 0) s = ErrnoError("fsync \"" + tmp + "\"");
  out.Reset();
  if (!s.ok()) {
    unlink(tmp.c_str());
    return s;
  }
  auto added = store_->AddBlobLayer(
      tmp, images::LayerInfo{layer.digest, layer.size, images::LayerFormat::kErofs, layer.blob,
                             layer.blob_size});
  if (!added.ok()) return added.status();
  metrics_->CountLayer("fetched");
  DSEC_LOG_INFO("cluster images: layer {} ({} bytes) fetched from {}", layer.digest,
                layer.blob_size, node);
  return OkStatus();
}

void ClusterImages::ServeLayer(int client, const std::string& digest) {
  auto fail = [&](int status, const std::string& code, const std::string& msg) {
    Json body = {{"error", {{"code", code}, {"message", msg}}}};
    std::string text = body.dump();
    std::string head =
        "HTTP/1.1 " + std::to_string(status) +
        (status == 404 ? " Not Found" : " Service Unavailable") +
        "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(text.size()) +
        "\r\nConnection: close\r\n\r\n";
    (void)SendAll(client, head + text, milliseconds(5000), stop_);
  };
  if (serving_.fetch_add(1) >= o_.max_serves) {
    serving_.fetch_sub(1);
    metrics_->CountLayer("serve_refused");
    return fail(
        503, "unavailable",
        "this node serves " + std::to_string(o_.max_serves) + " layers now: try another holder");
  }
  struct Done {
    ClusterImages* self;
    ~Done() {
      self->serving_.fetch_sub(1);
      self->metrics_->layers_serving.fetch_sub(1);
    }
  } done{this};
  metrics_->layers_serving.fetch_add(1);
  auto layer = images::ValidDigest(digest) ? store_->GetLayer(digest)
                                           : StatusOr<images::LayerInfo>(NotFound(""));
  if (!layer.ok() || layer->blob.empty())  // (only what it announced: blobs already made)
    return fail(404, "not_found", "this node has no blob of layer " + digest);
  UniqueFd file(open(store_->BlobPath(*layer).c_str(), O_RDONLY | O_CLOEXEC));
  if (!file) return fail(404, "not_found", "this node has no blob of layer " + digest);
  std::string head =
      "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
      "Content-Length: " +
      std::to_string(layer->blob_size) + "\r\nConnection: close\r\n\r\n";
  if (!SendAll(client, head, milliseconds(30000), stop_).ok()) return;
  off_t off = 0;
  const auto start = Clock::now();
  // Paced, it goes in steps of a tenth of a second's worth.
  const size_t step = o_.serve_bytes_per_s > 0
                          ? std::clamp<uint64_t>(o_.serve_bytes_per_s / 10, 512, 256 << 10)
                          : 256 << 10;
  while (static_cast<uint64_t>(off) < layer->blob_size && !stop_) {
    if (o_.serve_bytes_per_s > 0) {  // paced: no further ahead than the rate allows
      auto due = start + std::chrono::microseconds(static_cast<int64_t>(
                             static_cast<double>(off) * 1e6 / o_.serve_bytes_per_s));
      if (due > Clock::now()) std::this_thread::sleep_until(due);
    }
    size_t want = std::min<uint64_t>(step, layer->blob_size - off);
    ssize_t n = sendfile(client, file.get(), &off, want);
    if (n > 0) continue;
    if (n == 0) break;  // the file is shorter than its size: the peer sees a short body
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return;
    if (!Writable(client, milliseconds(30000), stop_)) return;
  }
  if (static_cast<uint64_t>(off) == layer->blob_size) metrics_->CountLayer("served");
  shutdown(client, SHUT_WR);
}

std::string ClusterImages::HoldersText() {
  cluster::LayerHolders h;
  for (const auto& l : store_->BlobLayers()) h.layers.push_back(l.digest);
  std::sort(h.layers.begin(), h.layers.end());
  return h.ToJson().dump();
}

void ClusterImages::Reconcile(const std::string& name, const cluster::ClusterImage* rec) {
  auto local = store_->GetImage(name);
  if (!local.ok()) return;
  // A copy, or an image this node made and published: the record is its truth. An image made
  // on this node alone is the node's own.
  if (!local->cached && !local->published) return;
  if (rec && SameLayers(*local, *rec)) return;
  if (Status s = store_->DeleteImage(name); !s.ok()) return;
  {
    MutexLock l(mu_);
    used_.erase(name);
  }
  DSEC_LOG_INFO("cluster images: {} dropped here ({})", local->name,
                rec ? "the cluster's record names other layers" : "deleted in the cluster");
  (void)store_->Collect();
}

void ClusterImages::Trim() {
  MutexLock t(trim_mu_);
  for (;;) {
    std::vector<images::Image> all = store_->ListImages();
    std::set<std::string> kept;  // layers images of this node's own reference
    for (const auto& img : all)
      if (!img.cached) kept.insert(img.layers.begin(), img.layers.end());
    std::map<std::string, uint64_t> cached;  // layer -> size
    for (const auto& img : all) {
      if (!img.cached) continue;
      for (const auto& d : img.layers)
        if (!kept.count(d))
          if (auto l = store_->GetLayer(d); l.ok()) cached[d] = l->blob_size;
    }
    uint64_t total = 0;
    for (const auto& [d, n] : cached) total += n;
    if (total <= o_.cache_bytes) return;
    // The least recently used cached image whose layers no sandbox holds.
    std::string victim;
    int64_t oldest = INT64_MAX;
    {
      MutexLock l(mu_);
      for (const auto& img : all) {
        if (!img.cached) continue;
        auto it = used_.find(img.name);
        int64_t used = it == used_.end() ? img.created_at : it->second;
        // Used in the last seconds: a create may be between finding it and holding its layers.
        if (used >= oldest || used > WallMs() - kRecentMs) continue;
        bool held = false;
        for (const auto& d : img.layers) held = held || store_->Held(d);
        if (held) continue;
        oldest = used;
        victim = img.name;
      }
    }
    if (victim.empty()) return;  // all in use: over the budget until they are not
    if (!store_->DeleteImage(victim).ok()) return;
    {
      MutexLock l(mu_);
      used_.erase(victim);
    }
    metrics_->CountLayer("evicted");
    DSEC_LOG_INFO("cluster images: {} evicted from the layer cache ({} bytes > {})", victim, total,
                  o_.cache_bytes);
    (void)store_->Collect();
  }
}

void ClusterImages::Watch() {
  const std::string prefix(cluster::kImagesPrefix);
  auto backoff = milliseconds(200);
  while (!stop_) {
    int64_t rev = 0;
    auto kvs = etcd_.RangePrefix(prefix, &rev);
    if (kvs.ok()) {
      // What changed while no watch ran: every local image against its record.
      std::map<std::string, cluster::ClusterImage> recs;
      for (const auto& kv : *kvs)
        if (auto r = cluster::ClusterImage::FromJson(kv.value); r.ok())
          recs.emplace(kv.key.substr(prefix.size()), std::move(*r));
      {
        MutexLock t(trim_mu_);
        for (const auto& img : store_->ListImages()) {
          auto it = recs.find(img.name);
          Reconcile(img.name, it == recs.end() ? nullptr : &it->second);
        }
      }
      backoff = milliseconds(200);
      Status s = etcd_.Watch(
          prefix, rev + 1,
          [&](const std::vector<etcd::Event>& events, int64_t) {
            MutexLock t(trim_mu_);
            for (const auto& e : events) {
              std::string name = e.kv.key.substr(prefix.size());
              if (e.deleted) {
                Reconcile(name, nullptr);
              } else if (auto r = cluster::ClusterImage::FromJson(e.kv.value); r.ok()) {
                Reconcile(name, &*r);
              }
            }
          },
          &stop_);
      if (stop_) break;
      if (!s.ok()) DSEC_LOG_DEBUG("cluster images: watch ended: {}", s.message());
    }
    for (auto until = Clock::now() + backoff; !stop_ && Clock::now() < until;)
      std::this_thread::sleep_for(milliseconds(50));
    backoff = std::min(backoff * 2, milliseconds(2000));
  }
}

}  // namespace dsec::edge
