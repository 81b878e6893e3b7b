// Request-id idempotency over a real state DB in a temp dir: replay, mismatch, waiting for a
// request in flight, what is not recorded, oversized responses, and replay after a restart.
#include "edge/idempotency.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>

#include "base/file_util.h"
#include "edge/state_store.h"

namespace dsec::edge {
namespace {

class IdempotencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsec-idem-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    Open();
  }
  void TearDown() override {
    idem_.reset();
    store_.reset();
    (void)RemoveTree(dir_);
  }
  void Open(uint64_t max_body = 1 << 20) {
    idem_.reset();
    store_.reset();
    auto s = StateStore::Open(dir_ + "/state.db");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
    idem_ = std::make_unique<Idempotency>(store_.get(), 1000, 3600, max_body, 64 << 20);
  }
  // Begin, keeping what `reply` was called with.
  Idempotency::Decision Begin(const std::string& key, const std::string& hash,
                              std::optional<http::HttpResponse>* got) {
    return idem_->Begin(key, hash, [got](http::HttpResponse r) { *got = std::move(r); });
  }
  static http::HttpResponse Created(std::string body) {
    http::HttpResponse r;
    r.status = 201;
    r.body = std::move(body);
    return r;
  }
  static bool Replayed(const http::HttpResponse& r) {
    for (const auto& [k, v] : r.headers)
      if (k == "Idempotent-Replay" && v == "true") return true;
    return false;
  }

  std::string dir_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<Idempotency> idem_;
};

TEST_F(IdempotencyTest, TheSameRequestAgainIsReplayedNotRun) {
  std::optional<http::HttpResponse> got;
  ASSERT_EQ(Begin("t:create:r1", "h1", &got), Idempotency::Decision::kRun);
  EXPECT_FALSE(got);
  idem_->Finish("t:create:r1", "h1", Created(R"({"id":"sb-1"})"));
  ASSERT_EQ(Begin("t:create:r1", "h1", &got), Idempotency::Decision::kReplayed);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 201);
  EXPECT_EQ(got->body, R"({"id":"sb-1"})");
  EXPECT_TRUE(Replayed(*got));
  // Another id runs.
  std::optional<http::HttpResponse> other;
  EXPECT_EQ(Begin("t:create:r2", "h1", &other), Idempotency::Decision::kRun);
}

TEST_F(IdempotencyTest, TheSameIdWithAnotherBodyIsAConflict) {
  std::optional<http::HttpResponse> got;
  ASSERT_EQ(Begin("k", "h1", &got), Idempotency::Decision::kRun);
  // While in flight, and after.
  ASSERT_EQ(Begin("k", "h2", &got), Idempotency::Decision::kReplayed);
  EXPECT_EQ(got->status, 409);
  idem_->Finish("k", "h1", Created("{}"));
  got.reset();
  ASSERT_EQ(Begin("k", "h2", &got), Idempotency::Decision::kReplayed);
  EXPECT_EQ(got->status, 409);
  EXPECT_NE(got->body.find("different request body"), std::string::npos);
}

TEST_F(IdempotencyTest, ARetryWhileTheFirstRunsWaitsForItsAnswer) {
  std::optional<http::HttpResponse> first, second, third;
  ASSERT_EQ(Begin("k", "h", &first), Idempotency::Decision::kRun);
  ASSERT_EQ(Begin("k", "h", &second), Idempotency::Decision::kWaiting);
  ASSERT_EQ(Begin("k", "h", &third), Idempotency::Decision::kWaiting);
  EXPECT_FALSE(second);
  idem_->Finish("k", "h", Created("done"));
  ASSERT_TRUE(second && third);
  EXPECT_EQ(second->body, "done");
  EXPECT_EQ(third->status, 201);
  EXPECT_TRUE(Replayed(*second));
}

TEST_F(IdempotencyTest, TransientAnswersAreNotRecorded) {
  for (int status : {429, 503, 401, 403}) {
    std::string key = "k" + std::to_string(status);
    std::optional<http::HttpResponse> got;
    ASSERT_EQ(Begin(key, "h", &got), Idempotency::Decision::kRun);
    http::HttpResponse r;
    r.status = status;
    idem_->Finish(key, "h", r);
    EXPECT_EQ(Begin(key, "h", &got), Idempotency::Decision::kRun) << status;
    idem_->Finish(key, "h", Created("{}"));
  }
  EXPECT_TRUE(Idempotency::Recordable(404));  // a definite answer
  EXPECT_TRUE(Idempotency::Recordable(422));
}

TEST_F(IdempotencyTest, AnOversizedResponseIsRecordedAsAlreadyRan) {
  Open(/*max_body=*/16);
  std::optional<http::HttpResponse> got;
  ASSERT_EQ(Begin("k", "h", &got), Idempotency::Decision::kRun);
  idem_->Finish("k", "h", Created(std::string(100, 'x')));
  ASSERT_EQ(Begin("k", "h", &got), Idempotency::Decision::kReplayed);
  EXPECT_EQ(got->status, 409);
  EXPECT_NE(got->body.find("100 bytes"), std::string::npos) << got->body;
}

TEST_F(IdempotencyTest, RecordsSurviveARestart) {
  std::optional<http::HttpResponse> got;
  ASSERT_EQ(Begin("k", "h", &got), Idempotency::Decision::kRun);
  idem_->Finish("k", "h", Created("kept"));
  Open();
  ASSERT_EQ(Begin("k", "h", &got), Idempotency::Decision::kReplayed);
  EXPECT_EQ(got->body, "kept");
}

TEST_F(IdempotencyTest, HashIsStableAcrossVersions) {
  // Records made by earlier edges must still match: these values never change.
  EXPECT_EQ(Idempotency::Hash(""), "14650fb0739d0383");
  EXPECT_EQ(Idempotency::Hash("a"), "44bd8ad473cd9906");
  EXPECT_NE(Idempotency::Hash("ab"), Idempotency::Hash("ba"));
}

}  // namespace
}  // namespace dsec::edge
