// Where a create goes: power-of-k choices among the nodes that can take it.
//
// Eligible: alive, not cordoned, serving the kind (or having the pool), and big enough for one
// sandbox of the request (max_memory_mb). Of those, the ones with room by their published load
// plus this apiserver's own creates in flight come first. The order of candidates is random for
// a create without a request id; with one it is the rendezvous (highest random weight) order of
// hash(request_id, node), so that every apiserver, for a retry of the same request, considers
// the same nodes in the same order (see Probes). Power-of-k: of the first k candidates with
// room, the least loaded goes first; the rest follow in order as fallbacks (a 429 from one is
// retried on the next).
//
// A failed placement says why: no node serves the kind (422), none that does is up (503), all
// are cordoned (503), the request can never fit any of them (422).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "api/create_request.h"
#include "apiserver/view.h"
#include "base/status.h"

namespace dsec::apiserver {

struct PlacementOptions {
  int k = 2;          // power-of-k choices
  int max_tries = 3;  // nodes a create is sent to before its 429 is the answer
  // What lacking the image counts for beside the load (0..1, its share of the sandboxes or
  // memory a node admits): a node that lacks all of it costs this much more.
  double layer_weight = 0.25;
};

// The nodes to try, best first (at most max_tries). `layers`: the layers of the create's image
// (the cluster's records); a node's cost is its load plus layer_weight times the share of
// those bytes it lacks, and one node that holds them all is a candidate beside the first k.
// A create pinned to a node (shape.node) goes there or nowhere: 422 when it
// cannot take it (no such node, not of the kind, too small), Unavailable while it is down.
StatusOr<std::vector<NodeState>> PlaceCreate(const std::vector<NodeState>& nodes,
                                             const api::CreateShape& shape,
                                             const PlacementOptions& opts, std::mt19937_64* rng,
                                             const std::vector<cluster::ClusterLayer>& layers = {});

// The share (0..1) of `layers`' bytes node `n` does not hold.
double MissingShare(const NodeState& n, const std::vector<cluster::ClusterLayer>& layers);

// For a create with a request id: the nodes that an earlier attempt of it (through any
// apiserver) may have been sent to, to be asked for its recorded answer before it is placed
// again. All alive nodes that serve the kind when they are few; the first k + max_tries of the
// rendezvous order otherwise.
std::vector<NodeState> Probes(const std::vector<NodeState>& nodes, const api::CreateShape& shape,
                              const PlacementOptions& opts);

// The rendezvous weight of a node for a request id.
uint64_t RendezvousWeight(const std::string& request_id, const std::string& node);

}  // namespace dsec::apiserver
