// The trajectory stores over real databases: the single-node one over a SQLite file in a temp
// dir, and the cluster's over PostgreSQL when DSEC_TEST_PG_CONNINFO names a database (the
// cluster suite starts a private one and runs these with it; without it those cases skip,
// saying so). The same cases for both: the group commit (every appended entry durable once its
// callback runs), bodies stored once, forks, checkpoints, conditional updates, expiry, reopening
// and collection; then what only one of them has (body files; layers in the shared store).
#include "edge/trajectory_store.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <future>
#include <random>
#include <thread>

#include "base/file_util.h"
#include "edge/pg_trajectory_store.h"
#include "http/auth.h"

namespace dsec::edge {
namespace {

const char* PgConninfo() { return getenv("DSEC_TEST_PG_CONNINFO"); }

// Runs SQL on the test database (its own connection).
std::string PgExec(const std::string& sql) {
  PGconn* c = PQconnectdb(PgConninfo());
  std::string out;
  if (PQstatus(c) == CONNECTION_OK) {
    PQsetNoticeProcessor(
        c, [](void*, const char*) {}, nullptr);
    PGresult* r = PQexec(c, sql.c_str());
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0) out = PQgetvalue(r, 0, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK && PQresultStatus(r) != PGRES_COMMAND_OK)
      out = std::string("error: ") + PQresultErrorMessage(r);
    PQclear(r);
  } else {
    out = std::string("error: ") + PQerrorMessage(c);
  }
  PQfinish(c);
  return out;
}

class TrajectoryStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsec-traj-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    if (pg()) {
      if (!PgConninfo()) GTEST_SKIP() << "DSEC_TEST_PG_CONNINFO is not set: no PostgreSQL";
      // Each case from empty tables (Open makes them again).
      ASSERT_EQ(PgExec("DROP TABLE IF EXISTS dsec_trajectories, dsec_trajectory_branches, "
                       "dsec_trajectory_entries, dsec_trajectory_checkpoints, "
                       "dsec_trajectory_blobs, dsec_trajectory_layers, "
                       "dsec_trajectory_layer_parts"),
                "");
    }
    Open();
  }
  void TearDown() override {
    store_.reset();
    (void)RemoveTree(dir_);
  }
  bool pg() const { return GetParam() == "pg"; }
  void Open() {
    store_.reset();
    if (pg()) {
      auto s = PgTrajectoryStore::Open(PgConninfo(), /*collect_grace_ms=*/0);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      store_ = std::move(*s);
      return;
    }
    auto s = SqliteTrajectoryStore::Open(dir_ + "/t.db", dir_ + "/bodies", /*fsync=*/true);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  SqliteTrajectoryStore* sqlite() { return dynamic_cast<SqliteTrajectoryStore*>(store_.get()); }
  // (A collection takes what was last touched before now, the shared store only what was
  // touched over a second ago: that passes first.)
  StatusOr<int64_t> Collect() {
    std::this_thread::sleep_for(std::chrono::milliseconds(pg() ? 1100 : 3));
    return store_->CollectBlobs();
  }
  TrajectoryInfo Info(const std::string& project, const std::string& id) {
    TrajectoryInfo t;
    t.project = project;
    t.id = id;
    t.params = "{}";
    t.checkpoint_every = 5;
    t.state = "recording";
    t.sandbox = "sb-x";
    t.created_ms = t.updated_ms = 1;
    t.expires_ms = 2;
    return t;
  }
  // Appends and waits for the commit.
  Status Append(const std::string& id, int64_t branch, int64_t seq, const std::string& answer) {
    TrajectoryEntry e;
    e.seq = seq;
    e.fingerprint = "fp" + std::to_string(seq);
    e.method = "POST";
    e.target = "/exec";
    e.mutating = true;
    e.status = 200;
    e.response = http::Sha256Hex(answer);
    e.follower = "sb-x";  // (Info's sandbox)
    std::promise<Status> done;
    store_->Append("p", id, branch, e, {{e.response, answer}},
                   [&done](Status s) { done.set_value(s); });
    return done.get_future().get();
  }
  std::string dir_;
  std::unique_ptr<TrajectoryStore> store_;
};

INSTANTIATE_TEST_SUITE_P(Stores, TrajectoryStoreTest, ::testing::Values("sqlite", "pg"),
                         [](const auto& info) { return info.param; });

TEST_P(TrajectoryStoreTest, EntriesAreDurableOnceAnsweredAndSurviveAReopen) {
  ASSERT_TRUE(store_->Create(Info("p", "a")).ok());
  EXPECT_EQ(store_->Create(Info("p", "a")).code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(store_->Create(Info("q", "a")).ok());  // another project's is another one
  for (int i = 1; i <= 3; ++i) ASSERT_TRUE(Append("a", 0, i, "out " + std::to_string(i)).ok());
  Open();  // a new connection sees every answered entry
  auto es = store_->Entries("p", "a", 0, 1, 100);
  ASSERT_TRUE(es.ok());
  ASSERT_EQ(es->size(), 3u);
  EXPECT_EQ((*es)[2].fingerprint, "fp3");
  auto body = store_->ReadBlob((*es)[1].response);
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(*body, "out 2");
  EXPECT_TRUE(store_->Entries("q", "a", 0, 1, 100)->empty());
  EXPECT_EQ(store_->Get("r", "a").status().code(), StatusCode::kNotFound);
}

TEST_P(TrajectoryStoreTest, AnswersComeWithTheirBodiesUpToABound) {
  ASSERT_TRUE(store_->Create(Info("p", "w")).ok());
  const std::string big(200 << 10, 'b');  // (a file in the node's store)
  ASSERT_TRUE(Append("w", 0, 1, "one").ok());
  ASSERT_TRUE(Append("w", 0, 2, big).ok());
  {
    // An empty answer keeps no body; one too large to keep is noted without one.
    TrajectoryEntry e;
    e.seq = 3;
    e.fingerprint = "fp3";
    e.method = "GET";
    e.target = "/files?path=/x";
    e.status = 200;
    e.follower = "sb-x";
    std::promise<Status> done;
    store_->Append("p", "w", 0, e, {}, [&done](Status s) { done.set_value(s); });
    ASSERT_TRUE(done.get_future().get().ok());
    e.seq = 4;
    e.kept = false;
    std::promise<Status> done2;
    store_->Append("p", "w", 0, e, {}, [&done2](Status s) { done2.set_value(s); });
    ASSERT_TRUE(done2.get_future().get().ok());
  }
  ASSERT_TRUE(Append("w", 0, 5, "five").ok());
  ASSERT_TRUE(Append("w", 1, 6, "other branch").ok());

  auto all = store_->Answers("p", "w", 0, 1, 100, 1 << 20);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 5u);
  EXPECT_EQ((*all)[0].e.fingerprint, "fp1");
  EXPECT_EQ((*all)[0].body, std::optional<std::string>("one"));
  EXPECT_EQ((*all)[1].body, std::optional<std::string>(big));
  EXPECT_EQ((*all)[2].body, std::optional<std::string>(""));
  EXPECT_FALSE((*all)[3].body.has_value());
  EXPECT_EQ((*all)[4].body, std::optional<std::string>("five"));
  EXPECT_EQ((*all)[4].e.seq, 5);

  // It stops before the entry that would go past max_bytes (the first comes whatever its
  // size).
  auto some = store_->Answers("p", "w", 0, 1, 100, 10);
  ASSERT_TRUE(some.ok());
  ASSERT_EQ(some->size(), 1u);
  EXPECT_EQ((*some)[0].body, std::optional<std::string>("one"));
  auto two = store_->Answers("p", "w", 0, 1, 100, big.size() + 3);
  ASSERT_TRUE(two.ok());
  ASSERT_EQ(two->size(), 4u);  // (entries 3 and 4 add no bytes; 5's would go past)
  auto less = store_->Answers("p", "w", 0, 1, 100, big.size() + 2);
  ASSERT_TRUE(less.ok());
  ASSERT_EQ(less->size(), 1u);
  auto one = store_->Answers("p", "w", 0, 2, 100, 0);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].e.seq, 2);
  // A range holds only its entries; past the end, none.
  auto mid = store_->Answers("p", "w", 0, 3, 4, 1 << 20);
  ASSERT_TRUE(mid.ok());
  ASSERT_EQ(mid->size(), 2u);
  EXPECT_TRUE(store_->Answers("p", "w", 0, 6, 100, 1 << 20)->empty());
}

TEST_P(TrajectoryStoreTest, ConcurrentAppendsShareCommits) {
  ASSERT_TRUE(store_->Create(Info("p", "c")).ok());
  constexpr int kThreads = 8, kEach = 50;
  std::atomic<int> failed{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i)
        if (!Append("c", t, i + 1, "x").ok()) ++failed;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(failed, 0);
  if (sqlite()) {
    auto [commits, entries] = sqlite()->commits();
    EXPECT_EQ(entries, kThreads * kEach);
    EXPECT_LT(commits, entries);  // grouped: fewer transactions than entries
  }
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(store_->Entries("p", "c", t, 1, 1000)->size(), 50u);
  // Content-addressed: one row for the eight hundred "x" answers.
  auto n = Collect();
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0);
}

TEST_P(TrajectoryStoreTest, LargeBodiesAreFilesAndAreCollectedWithTheirTrajectory) {
  ASSERT_TRUE(store_->Create(Info("p", "big")).ok());
  std::string big(SqliteTrajectoryStore::kInlineBlobMax + 1, 'z');
  ASSERT_TRUE(Append("big", 0, 1, big).ok());
  ASSERT_TRUE(Append("big", 0, 2, big).ok());  // the same bytes: one file
  if (sqlite()) {
    auto files = ListDir(dir_ + "/bodies");
    ASSERT_TRUE(files.ok());
    ASSERT_EQ(files->size(), 1u);
    EXPECT_EQ((*files)[0], http::Sha256Hex(big));
  } else {
    EXPECT_EQ(PgExec("SELECT COUNT(*) FROM dsec_trajectory_blobs"), "1");
  }
  EXPECT_EQ(*store_->ReadBlob(http::Sha256Hex(big)), big);
  EXPECT_EQ(*Collect(), 0);  // referenced
  // Not while a sandbox follows it.
  EXPECT_EQ(store_->Delete("p", "big").code(), StatusCode::kFailedPrecondition);
  TrajectoryInfo t = Info("p", "big");
  t.sandbox.clear();
  t.state = "stopped";
  ASSERT_TRUE(store_->Update(t, "sb-x").ok());
  ASSERT_TRUE(store_->Delete("p", "big").ok());
  EXPECT_EQ(*Collect(), 1);
  if (sqlite()) {
    EXPECT_TRUE(ListDir(dir_ + "/bodies")->empty());
  }
  EXPECT_EQ(store_->Get("p", "big").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->ReadBlob("../../etc/passwd").status().code(), StatusCode::kInvalidArgument);
}

TEST_P(TrajectoryStoreTest, ForkKeepsTheEntriesAndCheckpointsBeforeIt) {
  ASSERT_TRUE(store_->Create(Info("p", "f")).ok());
  for (int i = 1; i <= 6; ++i) ASSERT_TRUE(Append("f", 0, i, "o" + std::to_string(i)).ok());
  for (int64_t seq : {2, 4, 6}) {
    TrajectoryCheckpoint c;
    c.seq = seq;
    c.image = "host,base:1";
    c.jobs = {1};
    c.follower = "sb-x";
    ASSERT_TRUE(store_->AddCheckpoint("p", "f", 0, c).ok());
  }
  auto b = store_->Fork("p", "f", 0, 5);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(*b, 1);
  auto es = store_->Entries("p", "f", 1, 1, 100);
  ASSERT_EQ(es->size(), 4u);  // 1..4
  EXPECT_EQ(es->back().seq, 4);
  auto cps = store_->Checkpoints("p", "f", 1);
  ASSERT_EQ(cps->size(), 2u);  // 2 and 4
  EXPECT_EQ(cps->back().jobs, std::vector<int64_t>{1});
  auto info = store_->Get("p", "f");
  EXPECT_EQ(info->head, 1);
  EXPECT_EQ(info->branches, 2);
  auto branches = store_->Branches("p", "f");
  ASSERT_EQ(branches->size(), 2u);
  EXPECT_EQ((*branches)[0].entries, 6);
  EXPECT_EQ((*branches)[1].parent, 0);
  EXPECT_EQ((*branches)[1].fork_seq, 5);
  EXPECT_EQ((*branches)[1].last_seq, 4);
}

TEST_P(TrajectoryStoreTest, UpdatesAreConditionalAndExpiryTakesOnlyIdleOnes) {
  ASSERT_TRUE(store_->Create(Info("p", "u")).ok());  // followed by sb-x
  TrajectoryInfo t = Info("p", "u");
  t.sandbox = "sb-y";
  // Two resumes at once: only the one that saw it free (and sb-x does not let go here).
  EXPECT_EQ(store_->Update(t, "").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->Get("p", "u")->sandbox, "sb-x");
  t.sandbox.clear();
  t.expires_ms = 100;
  ASSERT_TRUE(store_->Update(t, "sb-x").ok());
  ASSERT_TRUE(store_->Create(Info("p", "busy")).ok());  // expired too, but followed
  auto gone = store_->Expire(1000);
  ASSERT_TRUE(gone.ok());
  ASSERT_EQ(gone->size(), 1u);
  EXPECT_EQ((*gone)[0].second, "u");
  EXPECT_EQ(store_->Get("p", "u").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(store_->Get("p", "busy").ok());
}

TEST_P(TrajectoryStoreTest, ASeqIsWrittenOnceAndAStoppedStoreRefuses) {
  ASSERT_TRUE(store_->Create(Info("p", "s")).ok());
  ASSERT_TRUE(Append("s", 0, 1, "a").ok());
  EXPECT_FALSE(Append("s", 0, 1, "b").ok());  // not overwritten
  EXPECT_EQ(*store_->ReadBlob(store_->Entry("p", "s", 0, 1)->value().response), "a");
  store_->Stop();
  EXPECT_EQ(Append("s", 0, 2, "c").code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace dsec::edge

namespace dsec::edge {
namespace {

class PgLayerTest : public TrajectoryStoreTest {};
INSTANTIATE_TEST_SUITE_P(Stores, PgLayerTest, ::testing::Values("pg"),
                         [](const auto& info) { return info.param; });

// A checkpoint's layer in the shared store: put in parts, fetched and checked, refused when
// what the store holds is not its blob, kept while a checkpoint names it, collected after.
TEST_P(PgLayerTest, LayersTravelInPartsAreCheckedAndCollected) {
  std::string blob(9 << 20, '\0');  // three parts of 4 MiB
  std::mt19937_64 rng(7);
  for (auto& ch : blob) ch = static_cast<char>(rng());
  const std::string file = dir_ + "/blob", back = dir_ + "/back";
  std::ofstream(file, std::ios::binary) << blob;
  TrajectoryLayer layer{"sha256:" + std::string(64, 'b'), 12345, "sha256:" + http::Sha256Hex(blob),
                        blob.size()};
  ASSERT_TRUE(store_->PutLayer(layer, file).ok());
  ASSERT_TRUE(store_->PutLayer(layer, file).ok());  // there already: touched only
  EXPECT_EQ(PgExec("SELECT COUNT(*) FROM dsec_trajectory_layer_parts"), "3");
  auto got = store_->FetchLayer(layer.digest, back);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->size, 12345u);
  EXPECT_EQ(got->blob, layer.blob);
  EXPECT_EQ(*ReadFileToString(back, blob.size() + 1), blob);
  // A size that is not the blob's is refused at the put.
  TrajectoryLayer wrong = layer;
  wrong.digest = "sha256:" + std::string(64, 'c');
  wrong.blob_size = 5;
  EXPECT_FALSE(store_->PutLayer(wrong, file).ok());
  EXPECT_EQ(store_->FetchLayer(wrong.digest, back).status().code(), StatusCode::kNotFound);
  // Named by a checkpoint: kept.
  ASSERT_TRUE(store_->Create(Info("p", "l")).ok());
  TrajectoryCheckpoint c;
  c.seq = 1;
  c.image = "host," + layer.digest;
  c.follower = "sb-x";
  ASSERT_TRUE(store_->AddCheckpoint("p", "l", 0, c).ok());
  // Another sandbox (one taken over) writes no entry nor checkpoint any more; a layer that is
  // not in the store cannot be named.
  TrajectoryCheckpoint stale = c;
  stale.seq = 2;
  stale.follower = "sb-old";
  EXPECT_EQ(store_->AddCheckpoint("p", "l", 0, stale).code(), StatusCode::kFailedPrecondition);
  TrajectoryCheckpoint missing = c;
  missing.seq = 3;
  missing.image = "host,sha256:" + std::string(64, 'e');
  EXPECT_EQ(store_->AddCheckpoint("p", "l", 0, missing).code(), StatusCode::kUnavailable);
  TrajectoryEntry e;
  e.seq = 1;
  e.fingerprint = "fp";
  e.method = "GET";
  e.target = "/files/\xff\xfe";  // bytes that are no UTF-8: kept as they are
  e.follower = "sb-old";
  std::promise<Status> done;
  store_->Append("p", "l", 0, e, {}, [&done](Status s) { done.set_value(s); });
  EXPECT_EQ(done.get_future().get().code(), StatusCode::kFailedPrecondition);
  e.follower = "sb-x";
  std::promise<Status> done2;
  store_->Append("p", "l", 0, e, {}, [&done2](Status s) { done2.set_value(s); });
  ASSERT_TRUE(done2.get_future().get().ok());
  EXPECT_EQ(store_->Entry("p", "l", 0, 1)->value().target, e.target);
  EXPECT_EQ(*Collect(), 0);
  // What the store holds changed under it: refused, never written as the layer.
  ASSERT_EQ(PgExec("UPDATE dsec_trajectory_layer_parts SET data = 'x' WHERE part = 1"), "");
  EXPECT_EQ(store_->FetchLayer(layer.digest, back).status().code(), StatusCode::kUnavailable);
  // Its checkpoint gone: collected, parts and all.
  TrajectoryInfo t = Info("p", "l");
  t.sandbox.clear();
  ASSERT_TRUE(store_->Update(t, "sb-x").ok());
  ASSERT_TRUE(store_->Delete("p", "l").ok());
  EXPECT_EQ(*Collect(), 1);
  EXPECT_EQ(PgExec("SELECT COUNT(*) FROM dsec_trajectory_layer_parts"), "0");
  EXPECT_EQ(store_->FetchLayer(layer.digest, back).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace dsec::edge
