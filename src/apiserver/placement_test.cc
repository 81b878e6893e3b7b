#include "apiserver/placement.h"

#include <gtest/gtest.h>

#include <map>

#include "apiserver/apiserver.h"

namespace dsec::apiserver {
namespace {

NodeState Node(const std::string& name, int64_t sandboxes = 0, int64_t max = 100,
               std::vector<std::string> kinds = {"container"}) {
  NodeState n;
  n.rec.node = name;
  n.rec.url = "http://127.0.0.1:1";
  n.rec.kinds = std::move(kinds);
  n.rec.max_sandboxes = max;
  n.rec.sandboxes = sandboxes;
  n.rec.admit_memory_mb = 10000;
  n.rec.max_memory_mb = 10000;
  n.alive = true;
  n.inflight = std::make_shared<std::atomic<int64_t>>(0);
  n.inflight_mb = std::make_shared<std::atomic<int64_t>>(0);
  return n;
}

std::vector<std::string> Names(const std::vector<NodeState>& v) {
  std::vector<std::string> out;
  for (const auto& n : v) out.push_back(n.rec.node);
  return out;
}

TEST(Placement, SaysWhyNothingFits) {
  std::mt19937_64 rng(1);
  PlacementOptions o;
  api::CreateShape vm;
  vm.kind = "microvm";
  auto r = PlaceCreate({Node("a"), Node("b")}, vm, o, &rng);
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("no node of the cluster serves kind \"microvm\""),
            std::string::npos);

  auto down = Node("a");
  down.alive = false;
  EXPECT_EQ(PlaceCreate({down}, {}, o, &rng).status().code(), StatusCode::kUnavailable);

  auto c1 = Node("a"), c2 = Node("b");
  c1.cordon = "cordon";
  c2.cordon = "drain";
  r = PlaceCreate({c1, c2}, {}, o, &rng);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("cordoned"), std::string::npos);

  api::CreateShape big;
  big.memory_mb = 20000;
  r = PlaceCreate({Node("a"), Node("b")}, big, o, &rng);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("can never fit any node"), std::string::npos);
}

TEST(Placement, SkipsCordonedSmallAndOtherKinds) {
  std::mt19937_64 rng(2);
  PlacementOptions o;
  o.max_tries = 10;
  auto cordoned = Node("c");
  cordoned.cordon = "cordon";
  auto small = Node("s");
  small.rec.max_memory_mb = 100;
  auto vm_only = Node("v", 0, 100, {"microvm"});
  api::CreateShape shape;
  shape.memory_mb = 512;
  for (int i = 0; i < 50; ++i) {
    auto r = PlaceCreate({cordoned, small, vm_only, Node("ok")}, shape, o, &rng);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(Names(*r), std::vector<std::string>{"ok"});
  }
}

TEST(Placement, FullNodesComeLastAndTriesAreBounded) {
  std::mt19937_64 rng(3);
  PlacementOptions o;
  o.max_tries = 2;
  for (int i = 0; i < 50; ++i) {
    auto r = PlaceCreate({Node("full1", 100), Node("room"), Node("full2", 100)}, {}, o, &rng);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->size(), 2u);
    EXPECT_EQ((*r)[0].rec.node, "room");
  }
  // Our own creates in flight count as load.
  auto busy = Node("busy", 99);
  busy.inflight->store(1);
  auto r = PlaceCreate({busy, Node("free", 50)}, {}, o, &rng);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].rec.node, "free");
}

TEST(Placement, PowerOfKPrefersTheLessLoaded) {
  std::mt19937_64 rng(4);
  PlacementOptions o;
  o.k = 3;  // all three sampled: the least loaded always wins
  for (int i = 0; i < 50; ++i) {
    auto r = PlaceCreate({Node("a", 50), Node("b", 10), Node("c", 90)}, {}, o, &rng);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ((*r)[0].rec.node, "b");
  }
  // k = 2 over equal nodes spreads creates over all of them.
  o.k = 2;
  std::map<std::string, int> first;
  for (int i = 0; i < 3000; ++i) {
    auto r = PlaceCreate({Node("a"), Node("b"), Node("c")}, {}, o, &rng);
    ASSERT_TRUE(r.ok());
    ++first[(*r)[0].rec.node];
  }
  for (const char* n : {"a", "b", "c"}) EXPECT_GT(first[n], 800) << n;
}

TEST(Placement, ARequestIdGivesEveryApiserverTheSameOrder) {
  PlacementOptions o;
  o.max_tries = 5;
  api::CreateShape shape;
  std::map<std::string, int> first;
  for (int i = 0; i < 300; ++i) {
    shape.request_id = "req-" + std::to_string(i);
    std::mt19937_64 r1(i), r2(i * 7 + 1);
    auto x = PlaceCreate({Node("a"), Node("b"), Node("c"), Node("d")}, shape, o, &r1);
    auto y = PlaceCreate({Node("d"), Node("c"), Node("b"), Node("a")}, shape, o, &r2);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(Names(*x), Names(*y));
    ++first[(*x)[0].rec.node];
  }
  for (const char* n : {"a", "b", "c", "d"}) EXPECT_GT(first[n], 40) << n;
}

TEST(Placement, ProbesCoverWhereAnEarlierAttemptCouldHaveGone) {
  PlacementOptions o;
  api::CreateShape shape;
  shape.request_id = "r1";
  auto down = Node("down");
  down.alive = false;
  auto cordoned = Node("c");
  cordoned.cordon = "cordon";
  auto p = Probes({Node("a"), down, cordoned, Node("b")}, shape, o);
  EXPECT_EQ(Names(p), (std::vector<std::string>{"a", "c", "b"}));
  std::vector<NodeState> many;
  for (int i = 0; i < 40; ++i) many.push_back(Node("n" + std::to_string(i)));
  p = Probes(many, shape, o);
  EXPECT_EQ(p.size(), static_cast<size_t>(o.k + o.max_tries));
  // The placement's own candidates for that id are among them.
  std::mt19937_64 rng(5);
  auto placed = PlaceCreate(many, shape, o, &rng);
  ASSERT_TRUE(placed.ok());
  for (const auto& n : *placed) {
    bool found = false;
    for (const auto& q : p) found = found || q.rec.node == n.rec.node;
    EXPECT_TRUE(found) << n.rec.node;
  }
}

TEST(Placement, NodeOfSandboxId) {
  EXPECT_EQ(NodeOfSandbox("sb-n1-abcdefghijkl"), "n1");
  EXPECT_EQ(NodeOfSandbox("sb-my-node-2-abcdefghijkl"), "my-node-2");
  EXPECT_EQ(NodeOfSandbox("sb-abcdefghijkl"), "");
  EXPECT_EQ(NodeOfSandbox("xx-n1-abcdefghijkl"), "");
  EXPECT_EQ(NodeOfSandbox("sb-n1_abcdefghijkl"), "");
}

TEST(Placement, PrefersNodesThatHoldTheImageWithoutFilteringOthers) {
  std::mt19937_64 rng(7);
  PlacementOptions o;
  const std::string d1 = "sha256:" + std::string(64, '1'), d2 = "sha256:" + std::string(64, '2');
  std::vector<cluster::ClusterLayer> layers = {{d1, 10, d1, 1000}, {d2, 10, d2, 3000}};
  std::vector<NodeState> nodes;
  for (int i = 0; i < 20; ++i) nodes.push_back(Node("n" + std::to_string(i)));
  nodes[5].layers = std::make_shared<const std::vector<std::string>>(std::vector{d1, d2});
  nodes[6].layers = std::make_shared<const std::vector<std::string>>(std::vector{d1});
  EXPECT_DOUBLE_EQ(MissingShare(nodes[5], layers), 0);
  EXPECT_DOUBLE_EQ(MissingShare(nodes[6], layers), 0.75);
  EXPECT_DOUBLE_EQ(MissingShare(nodes[0], layers), 1);
  // Equal loads: the holder leads (it is a candidate beside the random k).
  std::map<std::string, int> first;
  for (int i = 0; i < 200; ++i) ++first[PlaceCreate(nodes, {}, o, &rng, layers)->front().rec.node];
  EXPECT_EQ(first["n5"], 200);
  // A cost, not a filter: a loaded holder loses to idle nodes that lack the image.
  nodes[5].rec.sandboxes = 90;
  first.clear();
  for (int i = 0; i < 200; ++i) ++first[PlaceCreate(nodes, {}, o, &rng, layers)->front().rec.node];
  EXPECT_EQ(first["n5"], 0);
  EXPECT_GT(first.size(), 10u);
  // Without layers, placement is as before: spread.
  nodes[5].rec.sandboxes = 0;
  first.clear();
  for (int i = 0; i < 200; ++i) ++first[PlaceCreate(nodes, {}, o, &rng)->front().rec.node];
  EXPECT_LT(first["n5"], 60);
}

TEST(Placement, WithARequestIdAHolderIsChosenOnlyWhereRetriesProbe) {
  PlacementOptions o;
  std::mt19937_64 rng(5);
  const std::string d = "sha256:" + std::string(64, '3');
  std::vector<cluster::ClusterLayer> layers = {{d, 1, d, 100}};
  int in = 0, out = 0;
  for (int r = 0; r < 40; ++r) {
    std::vector<NodeState> nodes;
    for (int i = 0; i < 20; ++i) nodes.push_back(Node("n" + std::to_string(i)));
    nodes[r % 20].layers = std::make_shared<const std::vector<std::string>>(std::vector{d});
    api::CreateShape s;
    s.request_id = "req-" + std::to_string(r);
    std::vector<std::string> probed = Names(Probes(nodes, s, o));
    const std::string holder = "n" + std::to_string(r % 20);
    const bool probed_holder = std::find(probed.begin(), probed.end(), holder) != probed.end();
    auto placed = PlaceCreate(nodes, s, o, &rng, layers);
    ASSERT_TRUE(placed.ok());
    // Wherever it goes, a retry through another apiserver asks that node first.
    EXPECT_NE(std::find(probed.begin(), probed.end(), placed->front().rec.node), probed.end());
    EXPECT_EQ(placed->front().rec.node == holder, probed_holder) << s.request_id;
    (probed_holder ? in : out)++;
  }
  EXPECT_GT(in, 0);
  EXPECT_GT(out, 0);
}

TEST(Placement, APinnedCreateGoesToItsNodeOrNowhere) {
  std::mt19937_64 rng(3);
  PlacementOptions o;
  api::CreateShape s;
  s.node = "b";
  auto cordoned = Node("b");
  cordoned.cordon = "cordon";
  auto r = PlaceCreate({Node("a"), cordoned, Node("c")}, s, o, &rng);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Names(*r), std::vector<std::string>{"b"});
  s.node = "zz";
  EXPECT_EQ(PlaceCreate({Node("a")}, s, o, &rng).status().code(), StatusCode::kUnimplemented);
  s.node = "a";
  s.kind = "microvm";
  EXPECT_EQ(PlaceCreate({Node("a")}, s, o, &rng).status().code(), StatusCode::kUnimplemented);
  s.kind = "container";
  auto down = Node("a");
  down.alive = false;
  EXPECT_EQ(PlaceCreate({down}, s, o, &rng).status().code(), StatusCode::kUnavailable);
  s.memory_mb = 20000;
  EXPECT_EQ(PlaceCreate({Node("a")}, s, o, &rng).status().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace dsec::apiserver
