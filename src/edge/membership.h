// The edge's membership of a cluster (config cluster_etcd): it registers its record
// (cluster/node_record.h) under an etcd lease of cluster_lease_ttl_s, refreshes the lease every
// third of it, and republishes the record when its load changes, at most every 250 ms. When
// etcd is unreachable it keeps serving its sandboxes and registers again as soon as it can (a
// lapsed lease means a new one). Stop revokes the lease, so the node leaves placement at once.
//
// Thread safety: Start and Stop from one thread; the work runs on a thread of its own.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "cluster/etcd.h"
#include "cluster/node_record.h"

namespace dsec::edge {

class Membership {
 public:
  // `record` is called for the current record (load included) on the membership thread.
  Membership(std::vector<std::string> etcd, int64_t ttl_s,
             std::function<cluster::NodeRecord()> record);
  ~Membership();
  void Start();
  void Stop();

  bool registered() const { return registered_.load(); }

 private:
  void Run();

  etcd::Client etcd_;
  int64_t ttl_s_;
  std::function<cluster::NodeRecord()> record_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> registered_{false};
  std::thread thread_;
};

}  // namespace dsec::edge
