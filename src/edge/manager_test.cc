// The manager over a fake backend (backends/testing/fake_backend.h) and a fake clock: its state
// machine, admission, TTL and idle reaping, deletion during creation and re-adoption, in
// milliseconds and without root.
#include "edge/manager.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <thread>

#include "backends/testing/fake_backend.h"
#include "base/file_util.h"
#include "base/testing/poll.h"
#include "edge/state_store.h"

namespace dsec::edge {
namespace {

using backends::testing::FakeBackend;

class ManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dsec-manager-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    cfg_.node = "mt";
    cfg_.reap_interval_ms = 1000000;  // the tests reap by hand
    OpenManager();
  }
  void TearDown() override {
    manager_.reset();
    store_.reset();
    (void)RemoveTree(dir_);
  }
  void OpenManager() {
    manager_.reset();
    store_.reset();
    auto store = StateStore::Open(dir_ + "/state.db");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    manager_ = std::make_unique<Manager>(cfg_, std::vector<backends::Backend*>{&backend_},
                                         store_.get(), &metrics_);
    manager_->SetClock(&clock_);
  }
  // Creates one sandbox and waits for it.
  std::string CreateOne(CreateParams p = {}) {
    auto r = manager_->Create(p, 1, /*wait=*/true, nullptr);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? (*r)[0].id : "";
  }
  // The record's state, read without counting as a call (Get would reset the idle time).
  std::string State(const std::string& id) {
    auto list = manager_->List({});
    EXPECT_TRUE(list.ok());
    for (const auto& r : list->sandboxes)
      if (r.id == id) return std::string(PhaseName(r.state));
    return "gone";
  }

  std::string dir_;
  EdgeConfig cfg_;
  FakeClock clock_;
  FakeBackend backend_;
  Metrics metrics_;
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<Manager> manager_;
};

TEST_F(ManagerTest, CreateListDeleteKeepsTheStateDbInStep) {
  std::string a = CreateOne(), b = CreateOne();
  EXPECT_EQ(State(a), "running");
  EXPECT_EQ(backend_.created(), 2);
  auto list = manager_->List({});
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->sandboxes.size(), 2u);
  EXPECT_EQ(store_->ListSandboxes()->size(), 2u);
  ASSERT_TRUE(manager_->Delete(a).ok());
  EXPECT_EQ(State(a), "gone");
  EXPECT_EQ(manager_->Delete(a).code(), StatusCode::kNotFound);
  EXPECT_EQ(backend_.destroyed(), 1);
  EXPECT_EQ(store_->ListSandboxes()->size(), 1u);
  EXPECT_EQ(manager_->NodeInfo().sandboxes, 1);
}

TEST_F(ManagerTest, PauseAndResumeAreStatesOfTheRecord) {
  std::string id = CreateOne();
  ASSERT_TRUE(manager_->Pause(id).ok());
  EXPECT_EQ(State(id), "paused");
  ASSERT_TRUE(manager_->Resume(id).ok());
  EXPECT_EQ(State(id), "running");
  EXPECT_EQ(manager_->Pause("mt-nosuch").status().code(), StatusCode::kNotFound);
}

TEST_F(ManagerTest, AdmissionRefusesWhatDoesNotFitNow) {
  cfg_.max_sandboxes = 2;
  OpenManager();
  CreateOne();
  auto two = manager_->Create({}, 2, true, nullptr);  // all or nothing
  EXPECT_EQ(two.status().code(), StatusCode::kOverCapacity);
  EXPECT_EQ(backend_.created(), 1);
  CreateOne();
  EXPECT_EQ(manager_->Create({}, 1, true, nullptr).status().code(), StatusCode::kOverCapacity);
  EXPECT_EQ(manager_->size(), 2u);
}

TEST_F(ManagerTest, WhatCanNeverFitIs422WithTheNodesMaximum) {
  // The fake backend's largest sandbox: 4 CPUs, 8192 MiB, a 65536 MiB disk.
  auto refused = [&](auto set, const std::string& says, int count = 1) {
    CreateParams p;
    set(p.resources);
    auto r = manager_->Create(p, count, true, nullptr);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("can never fit"), std::string::npos);
  };
  refused([](Resources& r) { r.memory_mb = 8193; }, "at most 8192 MiB");
  refused([](Resources& r) { r.cpu = 4.5; }, "it has 4 CPUs");
  refused([](Resources& r) { r.disk_mb = 65537; }, "at most 65536 MiB");
  EXPECT_EQ(backend_.created(), 0);
  // At the maximum it fits.
  CreateParams p;
  p.resources.cpu = 4;
  p.resources.memory_mb = 8192;
  p.resources.disk_mb = 65536;
  CreateOne(p);
}

TEST_F(ManagerTest, WhatTheKindCannotDoIsRefusedBeforeAdmission) {
  backend_.caps.network = false;
  backend_.caps.host_image = false;
  CreateParams p;
  p.image = "layered:1";
  p.network.mode = net::NetMode::kOpen;
  // Even without waiting: no record a client could see, nothing admitted, nothing built.
  auto r = manager_->Create(p, 1, /*wait=*/false, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("network mode \"open\""), std::string::npos)
      << r.status().message();
  p.network.mode = net::NetMode::kNone;
  p.image = "host";
  r = manager_->Create(p, 1, false, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("image \"host\""), std::string::npos);
  EXPECT_EQ(manager_->size(), 0u);
  EXPECT_EQ(backend_.created(), 0);
  EXPECT_EQ(manager_->NodeInfo().used_memory_mb, 0);
  // A change the kind cannot make is refused before the sandbox is touched.
  p.image = "layered:1";
  std::string id = CreateOne(p);
  PatchParams patch;
  patch.network = net::NetworkPolicy{};
  patch.network->mode = net::NetMode::kOpen;
  auto changed = manager_->Patch(id, patch);
  EXPECT_EQ(changed.status().code(), StatusCode::kUnimplemented) << changed.status().ToString();
  ASSERT_TRUE(manager_->Capabilities(backends::Kind::kContainer).ok());
  EXPECT_FALSE(manager_->Capabilities(backends::Kind::kContainer)->network);
  EXPECT_EQ(manager_->Capabilities(backends::Kind::kMicrovm).status().code(),
            StatusCode::kUnimplemented);
}

TEST_F(ManagerTest, TtlReapingFollowsTheClock) {
  CreateParams p;
  p.ttl_s = 10;
  std::string id = CreateOne(p);
  clock_.Advance(9000);
  manager_->ReapOnce();
  EXPECT_EQ(State(id), "running");
  clock_.Advance(1000);
  manager_->ReapOnce();
  EXPECT_EQ(State(id), "gone");
  EXPECT_EQ(backend_.destroyed(), 1);
  EXPECT_TRUE(store_->ListSandboxes()->empty());
}

TEST_F(ManagerTest, IdleTtlCountsTimeWithoutCalls) {
  CreateParams p;
  p.idle_ttl_s = 5;
  std::string id = CreateOne(p);
  clock_.Advance(4000);
  ASSERT_TRUE(manager_->Get(id).ok());  // a call: the idle time starts again
  clock_.Advance(4000);
  manager_->ReapOnce();
  EXPECT_EQ(State(id), "running");
  clock_.Advance(1000);
  manager_->ReapOnce();
  EXPECT_EQ(State(id), "gone");
}

TEST_F(ManagerTest, AnAgentThatDiesFailsTheSandboxAndFreesItsMemory) {
  CreateParams p;
  p.resources.memory_mb = 128;
  std::string id = CreateOne(p);
  EXPECT_EQ(manager_->NodeInfo().used_memory_mb, 128);
  backend_.KillAgent(id);
  // The record says so at once (the backend's failure event), before any reaping.
  ASSERT_TRUE(dsec::testing::PollUntil([&] { return State(id) == "failed"; }));
  auto e = manager_->Get(id);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(manager_->Record(**e).reason, "agent exited");
  EXPECT_EQ((*e)->Sandbox().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->Pause(id).status().code(), StatusCode::kFailedPrecondition);
  // The reaper releases what it held, once.
  manager_->ReapOnce();
  manager_->ReapOnce();
  EXPECT_EQ(manager_->NodeInfo().used_memory_mb, 0);
  EXPECT_EQ(backend_.destroyed(), 1);
  // Labels may still change; a failed sandbox is deleted like any other.
  PatchParams patch;
  patch.labels["seen"] = "yes";
  EXPECT_TRUE(manager_->Patch(id, patch).ok());
  EXPECT_TRUE(manager_->Delete(id).ok());
  EXPECT_EQ(backend_.destroyed(), 1);
}

TEST_F(ManagerTest, ThePhaseFollowsTheBackendsPauseAndResume) {
  std::string id = CreateOne();
  auto e = manager_->Get(id);
  ASSERT_TRUE(e.ok());
  auto sb = (*e)->Sandbox();
  ASSERT_TRUE(sb.ok());
  // A pause or resume from below the manager (the sandbox resumes itself on any call) shows.
  ASSERT_TRUE((*sb)->Pause().ok());
  EXPECT_EQ(State(id), "paused");
  ASSERT_TRUE((*sb)->Resume().ok());
  EXPECT_EQ(State(id), "running");
}

TEST_F(ManagerTest, OperationsWaitForACreateAndSay503WhenItTakesTooLong) {
  std::vector<std::function<void()>> later;
  auto r = manager_->Create({}, 1, /*wait=*/false,
                            [&](std::function<void()> task) { later.push_back(std::move(task)); });
  ASSERT_TRUE(r.ok());
  std::string id = (*r)[0].id;
  auto e = manager_->Get(id);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->Sandbox(Op::kUse, 1).status().code(), StatusCode::kUnavailable);
  PatchParams patch;
  patch.labels["early"] = "ok";
  EXPECT_TRUE(manager_->Patch(id, patch).ok());  // updates need no running sandbox
  for (auto& t : later) t();
  EXPECT_TRUE((*e)->Sandbox(Op::kUse, 1).ok());
  EXPECT_EQ(State(id), "running");
}

TEST_F(ManagerTest, ACreateThatFailsLeavesNoRecord) {
  backend_.FailNextCreate(InvalidArgument("image is bad"));
  auto r = manager_->Create({}, 1, true, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(manager_->size(), 0u);
  EXPECT_TRUE(store_->ListSandboxes()->empty());
  EXPECT_EQ(manager_->NodeInfo().used_memory_mb, 0);
  // The node ran out of something: 503-like, worth a retry elsewhere.
  backend_.FailNextCreate(ResourceExhausted("no fds"));
  EXPECT_EQ(manager_->Create({}, 1, true, nullptr).status().code(), StatusCode::kUnavailable);
}

TEST_F(ManagerTest, DeletedWhileCreatingIsNeverMade) {
  std::vector<std::function<void()>> later;
  auto r = manager_->Create({}, 1, /*wait=*/false,
                            [&](std::function<void()> task) { later.push_back(std::move(task)); });
  ASSERT_TRUE(r.ok());
  std::string id = (*r)[0].id;
  EXPECT_EQ((*r)[0].state, Phase::kCreating);
  EXPECT_EQ(State(id), "creating");
  ASSERT_TRUE(manager_->Delete(id).ok());
  for (auto& t : later) t();
  EXPECT_EQ(backend_.created(), 0);
  EXPECT_EQ(manager_->size(), 0u);
  EXPECT_TRUE(store_->ListSandboxes()->empty());
}

TEST_F(ManagerTest, PersistedSandboxesAreReadoptedWithTheirRecords) {
  CreateParams p;
  p.labels = {{"job", "j1"}};
  p.ttl_s = 100;
  std::string id = CreateOne(p);
  manager_->Shutdown(/*persist=*/true);
  EXPECT_EQ(backend_.alive(), 0u);
  EXPECT_EQ(backend_.destroyed(), 0);
  OpenManager();
  auto rec = manager_->Recover();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->first, 1);
  EXPECT_EQ(State(id), "running");
  auto e = manager_->Get(id);
  SandboxRecord r = manager_->Record(**e);
  EXPECT_EQ(r.labels["job"], "j1");
  EXPECT_EQ(r.expires_at, r.created_at + 100000);
  // The job label still finds it.
  auto n = manager_->JobAction("j1", JobOp::kDelete);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1);
  EXPECT_EQ(backend_.destroyed(), 1);
}

TEST_F(ManagerTest, ShutdownDestroysEverything) {
  CreateOne();
  CreateOne();
  manager_->Shutdown(/*persist=*/false);
  EXPECT_EQ(backend_.destroyed(), 2);
  EXPECT_EQ(backend_.alive(), 0u);
  EXPECT_TRUE(store_->ListSandboxes()->empty());
  EXPECT_EQ(manager_->Create({}, 1, true, nullptr).status().code(), StatusCode::kUnavailable);
}

TEST(LifecycleTest, TheTransitionTable) {
  const Op ops[] = {Op::kUse, Op::kPause, Op::kResume, Op::kSnapshot, Op::kUpdate};
  for (Op op : ops) {
    EXPECT_TRUE(CheckOp(op, Phase::kRunning, "x").ok()) << OpName(op);
    EXPECT_TRUE(CheckOp(op, Phase::kPaused, "x").ok()) << OpName(op);
    EXPECT_EQ(CheckOp(op, Phase::kDeleted, "x").code(), StatusCode::kNotFound) << OpName(op);
    StatusCode creating = op == Op::kUpdate ? StatusCode::kOk : StatusCode::kUnavailable;
    EXPECT_EQ(CheckOp(op, Phase::kCreating, "x").code(), creating) << OpName(op);
    StatusCode failed = op == Op::kUpdate ? StatusCode::kOk : StatusCode::kFailedPrecondition;
    EXPECT_EQ(CheckOp(op, Phase::kFailed, "x", "oom").code(), failed) << OpName(op);
  }
  Status s = CheckOp(Op::kSnapshot, Phase::kFailed, "sb-1", "oom");
  EXPECT_EQ(s.message(), "sandbox sb-1 failed (oom) and cannot be snapshotted any more; delete it");
  EXPECT_EQ(PhaseName(Phase::kPaused), "paused");
}

// The REST layer's rendering of the manager's records (api/openapi.yaml's Sandbox and Node).
TEST(RecordsJsonTest, SandboxRecordsRenderTheApiShape) {
  SandboxRecord r;
  r.id = "n-1";
  r.state = Phase::kFailed;
  r.image = "base:1,extra:2";
  r.limits = {.cpu = 0.5, .memory_mb = 64, .pids = 32, .disk_mb = 8};
  r.labels = {{"job", "j"}};
  Json j = ToJson(r);
  EXPECT_EQ(j["state"], "failed");
  EXPECT_EQ(j["kind"], "container");
  EXPECT_EQ(j["image"], Json::array({"base:1", "extra:2"}));  // a stack as its list
  EXPECT_EQ(j["limits"], Json({{"cpu", 0.5}, {"memory_mb", 64}, {"pids", 32}, {"disk_mb", 8}}));
  EXPECT_EQ(j["labels"]["job"], "j");
  EXPECT_TRUE(j["reason"].is_null());
  EXPECT_FALSE(j.contains("pool"));  // only for a sandbox taken from a pool
  r.image = "host";
  r.reason = "agent exited";
  r.pool = "warm";
  j = ToJson(r);
  EXPECT_EQ(j["image"], "host");
  EXPECT_EQ(j["reason"], "agent exited");
  EXPECT_EQ(j["pool"], "warm");

  SandboxPage page{{r, r}, ""};
  EXPECT_EQ(ToJson(page)["sandboxes"].size(), 2u);
  EXPECT_TRUE(ToJson(page)["next_cursor"].is_null());
  page.next_cursor = "12.n-1";
  EXPECT_EQ(ToJson(page)["next_cursor"], "12.n-1");

  NodeReport n;
  n.by_state = {{Phase::kRunning, 2}, {Phase::kPaused, 1}};
  n.sandboxes = 3;
  n.used_memory_mb = 1536;
  Json nj = ToJson(n);
  EXPECT_EQ(nj["usage"]["by_state"], Json({{"running", 2}, {"paused", 1}}));
  EXPECT_EQ(nj["usage"]["memory_mb"], 1536);
  EXPECT_TRUE(nj["capacity"].contains("budgets"));
}

}  // namespace
}  // namespace dsec::edge
