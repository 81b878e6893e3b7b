// The edge's membership of a cluster (config cluster_etcd): it registers its record
// (cluster/node_record.h) under an etcd lease of cluster_lease_ttl_s, refreshes the lease every
// third of it, and republishes the record when its load changes, at most every 250 ms. When
// etcd is unreachable it keeps serving its sandboxes and registers again as soon as it can (a
// lapsed lease means a new one). Stop revokes the lease, so the node leaves placement at once.
// Beside the record it keeps /dsec/usage/<node> (what its sandboxes take, for the cluster's
// quotas) up to date at the same pace, without a lease: a lost node's sandboxes stay counted.
// With `layers`, /dsec/layers/<node> (cluster/image_record.h) says which image layers it can
// serve, under the same lease, rewritten when that changes.
// After the sandboxes went (or were kept, --persist), Finish says so there: the key goes when
// none is left.
//
// Thread safety: Start and Stop from one thread; the work runs on a thread of its own.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "cluster/etcd.h"
#include "cluster/node_record.h"

namespace dsec::cluster {

class Membership {
 public:
  // `record` is called for the current record (load included) on the membership thread.
  Membership(std::vector<std::string> etcd, int64_t ttl_s, std::function<NodeRecord()> record,
             std::function<NodeUsage()> usage, std::function<std::string()> layers = nullptr);
  ~Membership();
  void Start();
  void Stop();
  // After Stop, once the manager is done: the last word on the usage key.
  void Finish();

  bool registered() const { return registered_.load(); }

 private:
  void Run();

  etcd::Client etcd_;
  int64_t ttl_s_;
  std::function<NodeRecord()> record_;
  std::function<NodeUsage()> usage_;
  // The text of /dsec/layers/<node> (under the lease, as the record): what it can serve.
  std::function<std::string()> layers_;
  std::string usage_key_;  // set once registered (the membership thread's until Stop)
  std::atomic<bool> stop_{false};
  std::atomic<bool> registered_{false};
  std::thread thread_;
};

}  // namespace dsec::cluster
