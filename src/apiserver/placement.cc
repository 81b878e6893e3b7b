#include "apiserver/placement.h"

#include <algorithm>

namespace dsec::apiserver {

namespace {

bool Serves(const NodeState& n, const api::CreateShape& s) {
  if (!s.pool.empty())
    return std::find(n.rec.pools.begin(), n.rec.pools.end(), s.pool) != n.rec.pools.end();
  return n.rec.HasKind(s.kind);
}

int64_t Inflight(const NodeState& n) { return n.inflight ? n.inflight->load() : 0; }
int64_t InflightMb(const NodeState& n) { return n.inflight_mb ? n.inflight_mb->load() : 0; }

// Room for `count` more sandboxes of `mb` each by the published load and our own in flight.
bool HasRoom(const NodeState& n, int64_t mb, int64_t count) {
  if (n.rec.max_sandboxes > 0 && n.rec.sandboxes + Inflight(n) + count > n.rec.max_sandboxes)
    return false;
  if (mb > 0 && n.rec.admit_memory_mb > 0 &&
      n.rec.used_memory_mb + InflightMb(n) + mb * count > n.rec.admit_memory_mb)
    return false;
  return true;
}

double Load(const NodeState& n) {
  double s = static_cast<double>(n.rec.sandboxes + Inflight(n)) /
             static_cast<double>(std::max<int64_t>(1, n.rec.max_sandboxes));
  double m = n.rec.admit_memory_mb > 0 ? static_cast<double>(n.rec.used_memory_mb + InflightMb(n)) /
                                             static_cast<double>(n.rec.admit_memory_mb)
                                       : 0;
  return std::max(s, m);
}

// Sorts by rendezvous weight for `rid`, heaviest first.
void RendezvousSort(std::vector<const NodeState*>* v, const std::string& rid) {
  std::vector<std::pair<uint64_t, const NodeState*>> w;
  w.reserve(v->size());
  for (const NodeState* n : *v) w.emplace_back(RendezvousWeight(rid, n->rec.node), n);
  std::sort(w.begin(), w.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < w.size(); ++i) (*v)[i] = w[i].second;
}

}  // namespace

double MissingShare(const NodeState& n, const std::vector<cluster::ClusterLayer>& layers) {
  uint64_t total = 0, missing = 0;
  for (const auto& l : layers) {
    const uint64_t b = std::max<uint64_t>(1, l.blob_size);
    total += b;
    if (!n.layers || !std::binary_search(n.layers->begin(), n.layers->end(), l.digest))
      missing += b;
  }
  return total == 0 ? 0 : static_cast<double>(missing) / static_cast<double>(total);
}

uint64_t RendezvousWeight(const std::string& request_id, const std::string& node) {
  // FNV-1a over id, NUL, node, then a 64-bit finalizer (splitmix64) to spread the bits.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::string_view s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  };
  mix(request_id);
  mix(std::string_view("\0", 1));
  mix(node);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

StatusOr<std::vector<NodeState>> PlaceCreate(const std::vector<NodeState>& nodes,
                                             const api::CreateShape& shape,
                                             const PlacementOptions& opts, std::mt19937_64* rng,
                                             const std::vector<cluster::ClusterLayer>& layers) {
  const std::string what =
      shape.pool.empty() ? "kind \"" + shape.kind + "\"" : "pool \"" + shape.pool + "\"";
  if (!shape.node.empty()) {
    auto it = std::find_if(nodes.begin(), nodes.end(),
                           [&](const NodeState& n) { return n.rec.node == shape.node; });
    if (it == nodes.end()) return Unimplemented("no node " + shape.node + " in the cluster");
    if (!Serves(*it, shape)) return Unimplemented("node " + shape.node + " does not serve " + what);
    if (!it->alive) return Unavailable("node " + shape.node + " is unavailable");
    if (shape.memory_mb > 0 && it->rec.max_memory_mb > 0 && shape.memory_mb > it->rec.max_memory_mb)
      return ResourceExhausted("memory_mb " + std::to_string(shape.memory_mb) +
                               " can never fit node " + shape.node + ": it takes " +
                               std::to_string(it->rec.max_memory_mb) + " MiB");
    return std::vector<NodeState>{*it};  // (cordoned or not: an admin's pin)
  }
  int serving = 0, up = 0, uncordoned = 0;
  int64_t largest = 0;
  std::vector<const NodeState*> fits;  // (pointers: the nodes are many, their records big)
  for (const auto& n : nodes) {
    if (!Serves(n, shape)) continue;
    ++serving;
    if (!n.alive) continue;
    ++up;
    if (!n.cordon.empty()) continue;
    ++uncordoned;
    largest = std::max(largest, n.rec.max_memory_mb);
    if (shape.memory_mb > 0 && n.rec.max_memory_mb > 0 && shape.memory_mb > n.rec.max_memory_mb)
      continue;
    fits.push_back(&n);
  }
  if (serving == 0)
    return Unimplemented("no node of the cluster serves " + what + " (GET /v1/nodes lists them)");
  if (up == 0)
    return Unavailable("no node that serves " + what + " is up (" + std::to_string(serving) +
                       " unavailable)");
  if (uncordoned == 0)
    return Unavailable("every node that serves " + what + " is cordoned (" + std::to_string(up) +
                       " of them)");
  if (fits.empty())
    return ResourceExhausted("memory_mb " + std::to_string(shape.memory_mb) +
                             " can never fit any node: the largest takes " +
                             std::to_string(largest) + " MiB");
  if (!shape.request_id.empty()) {
    RendezvousSort(&fits, shape.request_id);
  } else {
    std::shuffle(fits.begin(), fits.end(), *rng);
  }
  // Those with room first, each group in that order.
  std::stable_partition(fits.begin(), fits.end(),
                        [&](const NodeState* n) { return HasRoom(*n, shape.memory_mb, 1); });
  // Power of k: the cheapest of the first k with room leads (cost: load, and the share of the
  // image it would have to fetch), and beside them the first node with room that holds the
  // whole image.
  auto cost = [&](const NodeState& n) {
    return Load(n) + (layers.empty() ? 0 : opts.layer_weight * MissingShare(n, layers));
  };
  const size_t k = static_cast<size_t>(std::max(1, opts.k));
  size_t best = 0;
  for (size_t i = 1; i < fits.size() && i < k; ++i) {
    if (!HasRoom(*fits[i], shape.memory_mb, 1)) break;
    if (cost(*fits[i]) < cost(*fits[best])) best = i;
  }
  if (!layers.empty() && HasRoom(*fits[0], shape.memory_mb, 1)) {
    // With a request id, only a node a retry's probes would ask (Probes) may be chosen.
    std::vector<std::string> probed;
    if (!shape.request_id.empty())
      for (const auto& p : Probes(nodes, shape, opts)) probed.push_back(p.rec.node);
    for (size_t i = k; i < fits.size(); ++i) {
      if (!HasRoom(*fits[i], shape.memory_mb, 1)) break;
      if (MissingShare(*fits[i], layers) > 0) continue;
      if (!shape.request_id.empty() &&
          std::find(probed.begin(), probed.end(), fits[i]->rec.node) == probed.end())
        continue;
      if (cost(*fits[i]) < cost(*fits[best])) best = i;
      break;
    }
  }
  if (best != 0)
    std::rotate(fits.begin(), fits.begin() + static_cast<long>(best),
                fits.begin() + static_cast<long>(best) + 1);
  if (fits.size() > static_cast<size_t>(std::max(1, opts.max_tries)))
    fits.resize(static_cast<size_t>(std::max(1, opts.max_tries)));
  std::vector<NodeState> out;
  out.reserve(fits.size());
  for (const NodeState* n : fits) out.push_back(*n);
  return out;
}

std::vector<NodeState> Probes(const std::vector<NodeState>& nodes, const api::CreateShape& shape,
                              const PlacementOptions& opts) {
  std::vector<const NodeState*> ps;
  for (const auto& n : nodes)
    if (n.alive && Serves(n, shape)) ps.push_back(&n);
  const size_t cap = static_cast<size_t>(std::max(1, opts.k) + std::max(1, opts.max_tries));
  if (ps.size() > std::max<size_t>(cap, 8)) {
    RendezvousSort(&ps, shape.request_id);
    ps.resize(cap);
  }
  std::vector<NodeState> out;
  out.reserve(ps.size());
  for (const NodeState* n : ps) out.push_back(*n);
  return out;
}

}  // namespace dsec::apiserver
