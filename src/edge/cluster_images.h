// Images across a cluster (issue 38), the edge's part: an image made through an apiserver (an
// import, a build, a snapshot) is published in etcd (cluster/image_record.h) with the blob
// digests of its layers; a create on any node that names an image this node does not have
// fetches the missing layers from a node that holds them, checks each against the record's
// digest before it is stored, and keeps a copy (a "cached" image); this node then serves those
// layers to others too (/dsec/layers/<node>, published by Membership).
//
//  - Fetches: one per layer however many creates wait for it (single flight); holders are tried
//    in random order, and a failed or corrupt transfer moves on to the next; a blob whose size or
//    sha256 is not the record's is thrown away, never used.
//  - Serving: GET /v1/layers/<digest> with the node token, answered by sendfile from the blob
//    (at most max_serves at once, 503 beyond; optionally paced to serve_bytes_per_s).
//  - Collection: a record deleted (through any apiserver) removes the node's copy, and a record
//    replaced under the same name makes a cached copy stale (dropped); cached images beyond
//    cache_bytes go least recently used first, unless a sandbox still holds their layers. The
//    image store's Collect then removes layers nothing references.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "cluster/etcd.h"
#include "cluster/image_record.h"
#include "images/store.h"

namespace dsec::edge {

class Metrics;

struct ClusterImagesOptions {
  std::vector<std::string> etcd;  // the gateway URLs
  std::string node;               // this node's name
  std::string token;              // the node token its peers take (the edges share it)
  uint64_t cache_bytes = 20ull << 30;
  int max_serves = 4;
  uint64_t serve_bytes_per_s = 0;  // 0: as fast as the network goes
  std::chrono::milliseconds fetch_idle{30000};
};

class ClusterImages {
 public:
  ClusterImages(ClusterImagesOptions o, images::ImageStore* store, Metrics* metrics);
  ~ClusterImages();
  void Start();  // the watch of the image records
  void Stop();

  // Whether `name` may be made for `project`: AlreadyExists when the cluster has an image of
  // that name (one project's names are every project's), Unavailable without etcd.
  Status CheckName(const std::string& name, const std::string& project);
  // `img` (already in the store, made for img.project) becomes the cluster's: the blobs of its
  // layers, then its record (only where the name is free: AlreadyExists otherwise). If it
  // cannot, the image is removed from the store too (the caller is told and may try again).
  Status Publish(const images::Image& img);
  // Each name of a create's stack (`names`: "host", layer digests and image names) that this
  // node lacks and the cluster has for `project` is fetched and stored here. A name the cluster
  // does not have for the project is left for the create to refuse. Unavailable when a layer
  // could not be had from any holder.
  Status Ensure(const std::string& project, const std::vector<std::string>& names);

  // Serves the blob of layer `digest` on a connection taken over after its head, on a thread of
  // its own (Stop waits for it); the connection is closed at the end.
  void StartServe(UniqueFd client, std::string digest);
  // What this node can serve, as /dsec/layers/<node> holds it.
  std::string HoldersText();

 private:
  struct Flight {
    bool done = false;
    Status result;
  };
  void ServeLayer(int client, const std::string& digest);
  Status PublishRecord(const images::Image& img);
  // `origin`: the node that made the image (tried when no holder is listed).
  Status Fetch(const cluster::ClusterLayer& layer, const std::string& origin);
  Status FetchFrom(const std::string& node, const std::string& url,
                   const cluster::ClusterLayer& layer);
  // Drops the node's copy of `name` if the record `rec` (null: gone) no longer says it.
  void Reconcile(const std::string& name, const cluster::ClusterImage* rec);
  void Trim();  // cached images beyond cache_bytes, least recently used first
  void Watch();
  void Touch(const std::string& name);

  ClusterImagesOptions o_;
  images::ImageStore* store_;
  Metrics* metrics_;
  etcd::Client etcd_;
  std::atomic<bool> stop_{false};
  std::thread watcher_;
  std::atomic<int> serving_{0};
  std::atomic<int> threads_{0};  // serving threads alive
  Mutex mu_;
  CondVar flight_done_;
  std::map<std::string, std::shared_ptr<Flight>> flights_ DSEC_GUARDED_BY(mu_);
  std::map<std::string, int64_t> used_ DSEC_GUARDED_BY(mu_);  // image -> last use (ms)
  Mutex trim_mu_;                                             // one trim (or reconcile) at a time
};

}  // namespace dsec::edge
