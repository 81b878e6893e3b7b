// The single-node trajectory store over a real SQLite file in a temp dir: the group commit
// (every appended entry durable once its callback runs, many per transaction under
// concurrency), bodies inline and as files, forks, checkpoints, reopening, and collection.
#include "edge/trajectory_store.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <future>
#include <thread>

#include "base/file_util.h"
#include "http/auth.h"

namespace dsec::edge {
namespace {

class TrajectoryStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsec-traj-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    Open();
  }
  void TearDown() override {
    store_.reset();
    (void)RemoveTree(dir_);
  }
  void Open() {
    store_.reset();
    auto s = SqliteTrajectoryStore::Open(dir_ + "/t.db", dir_ + "/bodies", /*fsync=*/true);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
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
    std::promise<Status> done;
    store_->Append("p", id, branch, e, {{e.response, answer}},
                   [&done](Status s) { done.set_value(s); });
    return done.get_future().get();
  }
  std::string dir_;
  std::unique_ptr<SqliteTrajectoryStore> store_;
};

TEST_F(TrajectoryStoreTest, EntriesAreDurableOnceAnsweredAndSurviveAReopen) {
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

TEST_F(TrajectoryStoreTest, ConcurrentAppendsShareCommits) {
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
  auto [commits, entries] = store_->commits();
  EXPECT_EQ(entries, kThreads * kEach);
  EXPECT_LT(commits, entries);  // grouped: fewer transactions than entries
  // Content-addressed: one row for the eight hundred "x" answers.
  auto n = store_->CollectBlobs();
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0);
}

TEST_F(TrajectoryStoreTest, LargeBodiesAreFilesAndAreCollectedWithTheirTrajectory) {
  ASSERT_TRUE(store_->Create(Info("p", "big")).ok());
  std::string big(SqliteTrajectoryStore::kInlineBlobMax + 1, 'z');
  ASSERT_TRUE(Append("big", 0, 1, big).ok());
  ASSERT_TRUE(Append("big", 0, 2, big).ok());  // the same bytes: one file
  auto files = ListDir(dir_ + "/bodies");
  ASSERT_TRUE(files.ok());
  ASSERT_EQ(files->size(), 1u);
  EXPECT_EQ((*files)[0], http::Sha256Hex(big));
  EXPECT_EQ(*store_->ReadBlob(http::Sha256Hex(big)), big);
  EXPECT_EQ(*store_->CollectBlobs(), 0);  // referenced
  // Not while a sandbox follows it.
  EXPECT_EQ(store_->Delete("p", "big").code(), StatusCode::kFailedPrecondition);
  TrajectoryInfo t = Info("p", "big");
  t.sandbox.clear();
  t.state = "stopped";
  ASSERT_TRUE(store_->Update(t, "sb-x").ok());
  ASSERT_TRUE(store_->Delete("p", "big").ok());
  EXPECT_EQ(*store_->CollectBlobs(), 1);
  EXPECT_TRUE(ListDir(dir_ + "/bodies")->empty());
  EXPECT_EQ(store_->Get("p", "big").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->ReadBlob("../../etc/passwd").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(TrajectoryStoreTest, ForkKeepsTheEntriesAndCheckpointsBeforeIt) {
  ASSERT_TRUE(store_->Create(Info("p", "f")).ok());
  for (int i = 1; i <= 6; ++i) ASSERT_TRUE(Append("f", 0, i, "o" + std::to_string(i)).ok());
  for (int64_t seq : {2, 4, 6}) {
    TrajectoryCheckpoint c;
    c.seq = seq;
    c.image = "host,sha256:" + std::string(64, 'a');
    c.jobs = {1};
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

TEST_F(TrajectoryStoreTest, UpdatesAreConditionalAndExpiryTakesOnlyIdleOnes) {
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

TEST_F(TrajectoryStoreTest, ASeqIsWrittenOnceAndAStoppedStoreRefuses) {
  ASSERT_TRUE(store_->Create(Info("p", "s")).ok());
  ASSERT_TRUE(Append("s", 0, 1, "a").ok());
  EXPECT_FALSE(Append("s", 0, 1, "b").ok());  // not overwritten
  EXPECT_EQ(*store_->ReadBlob(store_->Entry("p", "s", 0, 1)->value().response), "a");
  store_->Stop();
  EXPECT_EQ(Append("s", 0, 2, "c").code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace dsec::edge
