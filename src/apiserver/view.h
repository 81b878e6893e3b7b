// The apiserver's picture of the cluster, kept in memory from one etcd watch on /dsec/: every
// node that registered (cluster/node_record.h) with its record and load, whether its lease is
// alive, and whether it is cordoned. Creates and routing read only this view, never etcd. A node
// whose key went away (its lease lapsed, or it left) stays in the view as not alive, so calls on
// its sandboxes can say which node is unavailable. When etcd cannot be reached the view keeps
// what it had (routing goes on) and etcd_ok() turns false (creates are refused) until a range
// read and a new watch succeed.
//
// Thread safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apiserver/access.h"
#include "apiserver/quota.h"
#include "base/mutex.h"
#include "cluster/etcd.h"
#include "cluster/image_record.h"
#include "cluster/node_record.h"
#include "http/client.h"

namespace dsec::apiserver {

struct NodeState {
  cluster::NodeRecord rec;
  bool alive = false;      // its lease holds its record
  std::string cordon;      // "", "cordon" or "drain"
  int64_t changed_ms = 0;  // when it last became alive or unavailable (wall clock)
  std::shared_ptr<http::HttpClient> client;  // to rec.url
  // To its compatibility listeners (rec.e2b_url, rec.sandbox_fusion_url); null without one.
  std::shared_ptr<http::HttpClient> e2b_client, fusion_client;
  // Creates this apiserver has sent to the node and not had answered: counted as load on top
  // of what the node last published.
  std::shared_ptr<std::atomic<int64_t>> inflight;
  std::shared_ptr<std::atomic<int64_t>> inflight_mb;
  // The image layers it can serve (hence holds), sorted (/dsec/layers/<node>).
  std::shared_ptr<const std::vector<std::string>> layers;

  // "ready", "cordoned", "draining" or "unavailable".
  std::string State() const;
};

class ClusterView {
 public:
  // `access` (may be null) gets the projects and tokens of the same watch, `quotas` (may be
  // null) the quota limits, holds and nodes' usage, and the revision each batch brings.
  explicit ClusterView(etcd::Client* etcd, AccessView* access = nullptr, Quotas* quotas = nullptr);
  ~ClusterView();
  void Start();
  void Stop();

  bool loaded() const { return loaded_.load(); }
  bool etcd_ok() const { return etcd_ok_.load(); }
  // Since when (ms since the epoch) the view has not been in step with etcd; 0 while it is.
  int64_t stale_since_ms() const { return stale_since_ms_.load(); }
  std::vector<NodeState> Nodes() const;
  // The same, shared: rebuilt only after something changed (creates read it without copying
  // every node's record).
  std::shared_ptr<const std::vector<NodeState>> NodesView() const;
  std::optional<NodeState> Find(const std::string& node) const;
  // The cluster's images (/dsec/images/), by name.
  std::vector<cluster::ClusterImage> Images() const;
  std::optional<cluster::ClusterImage> Image(const std::string& name) const;

  // For tests of placement and for the view's own updates.
  void ApplyPut(const std::string& key, const std::string& value);
  void ApplyDelete(const std::string& key);

 private:
  void Run();
  void Reset(const std::vector<etcd::KeyValue>& kvs);

  etcd::Client* etcd_;
  AccessView* access_;
  Quotas* quotas_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> loaded_{false};
  std::atomic<bool> etcd_ok_{false};
  std::atomic<int64_t> stale_since_ms_{0};
  std::thread thread_;
  mutable Mutex mu_;
  std::map<std::string, NodeState> nodes_ DSEC_GUARDED_BY(mu_);
  std::map<std::string, std::string> cordons_ DSEC_GUARDED_BY(mu_);
  std::map<std::string, cluster::ClusterImage> images_ DSEC_GUARDED_BY(mu_);
  // NodesView's, until nodes_, cordons_ or layers_ change (null: to be rebuilt).
  mutable std::shared_ptr<const std::vector<NodeState>> view_ DSEC_GUARDED_BY(mu_);
  // A node's layers may come before its record (or outlive it): kept apart, joined in Nodes().
  std::map<std::string, std::shared_ptr<const std::vector<std::string>>> layers_
      DSEC_GUARDED_BY(mu_);
};

}  // namespace dsec::apiserver
