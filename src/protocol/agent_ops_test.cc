#include "protocol/agent_ops.h"

#include <gtest/gtest.h>

namespace dsec::protocol {
namespace {

template <class T>
T RoundTrip(const T& v) {
  Json j = Encode(v);
  auto back = DecodeAs<T>(j);
  EXPECT_TRUE(back.ok()) << back.status().ToString() << " for " << j.dump();
  return back.ok() ? *back : T{};
}

TEST(AgentOpsTest, RequestsCarryTheirOpName) {
  EXPECT_EQ(Encode(ReadFileRequest{{1, 2}, "/a", 5, 0})["op"], "read_file");
  EXPECT_EQ(Encode(ListDirRequest{{1, 2}, "/a", 5})["op"], "list");
  EXPECT_EQ(Encode(SignalAllRequest{15})["op"], "signal_all");
  EXPECT_EQ(Encode(PingRequest{})["op"], "ping");
}

TEST(AgentOpsTest, FileRequestsRoundTrip) {
  auto r = RoundTrip(ReadFileRequest{{1000, 1001}, "/workspace/x", 77, 3});
  EXPECT_EQ(r.as.uid, 1000u);
  EXPECT_EQ(r.as.gid, 1001u);
  EXPECT_EQ(r.path, "/workspace/x");
  EXPECT_EQ(r.max_bytes, 77u);
  EXPECT_EQ(r.offset, 3u);
  auto w = RoundTrip(WriteFileRequest{{0, 0}, "/f", 0600, false, true});
  EXPECT_EQ(w.mode, 0600u);
  EXPECT_FALSE(w.mkdirs);
  EXPECT_TRUE(w.append);
  auto m = RoundTrip(MakeDirRequest{{5, 6}, "/d", 0700, false});
  EXPECT_EQ(m.mode, 0700u);
  EXPECT_FALSE(m.parents);
  EXPECT_TRUE(RoundTrip(RemoveRequest{{5, 6}, "/d", true}).recursive);
  EXPECT_EQ(RoundTrip(TarCreateRequest{{5, 6}, "/d", 99}).max_bytes, 99u);
  EXPECT_EQ(RoundTrip(TarExtractRequest{{5, 6}, "/d", 98}).max_bytes, 98u);
  EXPECT_EQ(RoundTrip(StatRequest{{7, 8}, "/s"}).as.gid, 8u);
}

TEST(AgentOpsTest, WatchDirAndItsEvents) {
  WatchDirRequest r{{1000, 1000}, "/home/user", true, true, 99};
  auto back = RoundTrip(r);
  EXPECT_EQ(back.path, "/home/user");
  EXPECT_TRUE(back.recursive);
  EXPECT_TRUE(back.include_entry);
  EXPECT_EQ(back.max_dirs, 99u);
  auto defaults = DecodeAs<WatchDirRequest>(Json{{"uid", 1}, {"gid", 1}, {"path", "/a"}});
  ASSERT_TRUE(defaults.ok()) << defaults.status().message();
  EXPECT_FALSE(defaults->recursive);
  EXPECT_EQ(defaults->max_dirs, 4096u);
  EXPECT_FALSE(
      DecodeAs<WatchDirRequest>(Json{{"uid", 1}, {"gid", 1}, {"path", "/a"}, {"max_dirs", 0}})
          .ok());
  FileEntry fe;
  fe.name = "a";
  fe.type = "file";
  fe.size = 3;
  auto ev = WatchEventFromJson(ToJson(WatchEvent{"d/a", "write", fe}));
  ASSERT_TRUE(ev.ok()) << ev.status().message();
  EXPECT_EQ(ev->name, "d/a");
  EXPECT_EQ(ev->type, "write");
  ASSERT_TRUE(ev->entry);
  EXPECT_EQ(ev->entry->size, 3u);
  EXPECT_FALSE(WatchEventFromJson(Json{{"name", "a"}, {"type", "explode"}}).ok());
  EXPECT_FALSE(WatchEventFromJson(Json::array()).ok());
}

TEST(AgentOpsTest, CaptureLayerRequest) {
  CaptureLayerRequest r;
  r.skip = {"/etc/hostname"};
  r.empty = {"/proc"};
  r.keep_setuid = true;
  r.max_apparent_bytes = 123;
  auto back = RoundTrip(r);
  EXPECT_EQ(back.skip, r.skip);
  EXPECT_EQ(back.empty, r.empty);
  EXPECT_TRUE(back.keep_setuid);
  EXPECT_EQ(back.max_apparent_bytes, 123u);
  EXPECT_FALSE(DecodeAs<CaptureLayerRequest>(Json{{"skip", {"relative"}}}).ok());
  EXPECT_FALSE(DecodeAs<CaptureLayerRequest>(Json{{"empty", "/x"}}).ok());
  EXPECT_TRUE(DecodeAs<CaptureLayerRequest>(Json::object()).ok());
}

// The agent has no default user: every file operation must name its ids.
TEST(AgentOpsTest, MissingIdsAreAnError) {
  for (const char* op : {"read_file", "write_file", "list", "stat", "mkdir", "remove",
                         "tar_extract", "tar_create", "watch_dir"}) {
    Json j = {{"op", op}, {"path", "/x"}, {"gid", 1000}};
    Status s;
    std::string name = op;
    if (name == "read_file") s = DecodeAs<ReadFileRequest>(j).status();
    if (name == "write_file") s = DecodeAs<WriteFileRequest>(j).status();
    if (name == "list") s = DecodeAs<ListDirRequest>(j).status();
    if (name == "stat") s = DecodeAs<StatRequest>(j).status();
    if (name == "mkdir") s = DecodeAs<MakeDirRequest>(j).status();
    if (name == "remove") s = DecodeAs<RemoveRequest>(j).status();
    if (name == "tar_extract") s = DecodeAs<TarExtractRequest>(j).status();
    if (name == "tar_create") s = DecodeAs<TarCreateRequest>(j).status();
    if (name == "watch_dir") s = DecodeAs<WatchDirRequest>(j).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << op;
    EXPECT_NE(s.message().find("uid"), std::string::npos) << op << ": " << s.message();
  }
  ExecSpec e;
  e.argv = {"true"};
  Json j = ToJson(e);
  j.erase("uid");
  EXPECT_FALSE(ExecSpecFromJson(j).ok());
}

TEST(AgentOpsTest, RejectsBadFields) {
  EXPECT_FALSE(DecodeAs<ReadFileRequest>(Json{{"uid", 1}, {"gid", 1}, {"path", "rel"}}).ok());
  EXPECT_FALSE(DecodeAs<ReadFileRequest>(Json{{"uid", 70000}, {"gid", 1}, {"path", "/a"}}).ok());
  EXPECT_FALSE(
      DecodeAs<ReadFileRequest>(Json{{"uid", 1}, {"gid", 1}, {"path", std::string("/a\0b", 4)}})
          .ok());
  EXPECT_FALSE(
      DecodeAs<ListDirRequest>(Json{{"uid", 1}, {"gid", 1}, {"path", "/a"}, {"max_entries", 0}})
          .ok());
  EXPECT_FALSE(
      DecodeAs<MakeDirRequest>(Json{{"uid", 1}, {"gid", 1}, {"path", "/a"}, {"mode", 070000}})
          .ok());
  EXPECT_FALSE(DecodeAs<SignalAllRequest>(Json{{"signal", 0}}).ok());
  EXPECT_FALSE(DecodeAs<ShellRunRequest>(Json{{"shell_id", ""}, {"command", "x"}}).ok());
  EXPECT_FALSE(DecodeAs<PingRequest>(Json::array()).ok());
}

TEST(AgentOpsTest, ResponsesRoundTripAndCarryErrors) {
  ListDirResponse l;
  l.entries.push_back({"a", "file", 3, 0644, 5});
  l.truncated = true;
  auto back = RoundTrip(l);
  ASSERT_EQ(back.entries.size(), 1u);
  EXPECT_EQ(back.entries[0].name, "a");
  EXPECT_TRUE(back.truncated);
  EXPECT_EQ(RoundTrip(StatResponse{{"s", "dir", 0, 0755, 1}, 3, 4}).gid, 4u);
  auto fs = RoundTrip(StatResponse{{"s", "dir", 0, 0755, 1}, 3, 4, 1ull << 40, 5ull << 30});
  EXPECT_EQ(fs.fs_bytes, 1ull << 40);
  EXPECT_EQ(fs.fs_used, 5ull << 30);
  // An older agent sends no filesystem figures: zero.
  StatResponse old;
  ASSERT_TRUE(Decode(Json::parse(R"({"name": "s", "type": "dir", "size": 0, "mode": 493,
                                     "mtime": 1, "uid": 3, "gid": 4})"),
                     &old)
                  .ok());
  EXPECT_EQ(old.fs_bytes, 0u);
  EXPECT_EQ(old.mem_total, 0u);
  // A microVM's stats ask for the machine too: asked only when set, answered when known.
  EXPECT_FALSE(RoundTrip(StatRequest{{0, 0}, "/"}).machine);
  EXPECT_TRUE(RoundTrip(StatRequest{{0, 0}, "/", true}).machine);
  StatResponse m{{"s", "dir", 0, 0755, 1}, 0, 0, 1 << 20, 1 << 10};
  m.mem_total = 256ull << 20;
  m.mem_available = 100ull << 20;
  m.user_pids = 7;
  auto mb = RoundTrip(m);
  EXPECT_EQ(mb.mem_total, 256ull << 20);
  EXPECT_EQ(mb.mem_available, 100ull << 20);
  EXPECT_EQ(mb.user_pids, 7u);
  EXPECT_EQ(RoundTrip(ShellOpenResponse{"sh1"}).shell_id, "sh1");
  ShellRunResponse sr;
  sr.result.exit_code = 3;
  sr.session_ended = true;
  EXPECT_TRUE(RoundTrip(sr).session_ended);
  EXPECT_EQ(RoundTrip(TarExtractResponse{1, 2, 3}).skipped, 3u);
  Status s = DecodeAs<ListDirResponse>(ErrorJson(NotFound("gone"))).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
}

TEST(AgentOpsTest, HelloVersions) {
  Hello h;
  h.pid = 12;
  h.shells = {"sh1"};
  auto back = RoundTrip(h);
  EXPECT_EQ(back.version, kProtocolVersion);
  EXPECT_EQ(back.shells, h.shells);
  EXPECT_TRUE(CheckVersion(back).ok());
  // An agent from before versioned hellos said nothing: version 1, still spoken.
  auto old = DecodeAs<Hello>(Json{{"pid", 1}});
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->version, 1);
  EXPECT_TRUE(CheckVersion(*old).ok());
  Hello future;
  future.version = kProtocolVersion + 1;
  EXPECT_EQ(CheckVersion(future).code(), StatusCode::kFailedPrecondition);
}

TEST(AgentOpsTest, AuthAndReady) {
  EXPECT_EQ(RoundTrip(Auth{"abc123"}).secret, "abc123");
  EXPECT_FALSE(RoundTrip(Auth{"abc123"}).identity);
  GuestIdentity g;
  g.sandbox_id = "sb-1";
  g.hostname = "sb-1";
  g.secret = "feed";
  g.realtime_ns = 1234567890123;
  g.entropy = "00ff";
  g.files.push_back({"/etc/machine-id", "0123\n", 0444, 0, 0});
  Auth a = RoundTrip(Auth{"abc123", g});
  ASSERT_TRUE(a.identity);
  EXPECT_EQ(a.identity->hostname, "sb-1");
  EXPECT_EQ(a.identity->secret, "feed");
  EXPECT_EQ(a.identity->realtime_ns, 1234567890123);
  EXPECT_EQ(a.identity->entropy, "00ff");
  ASSERT_EQ(a.identity->files.size(), 1u);
  EXPECT_EQ(a.identity->files[0].content, "0123\n");
  Json bad = Encode(Auth{"abc123", g});
  bad["identity"]["hostname"] = "";
  EXPECT_EQ(DecodeAs<Auth>(bad).status().code(), StatusCode::kInvalidArgument);
  bad = Encode(Auth{"abc123", g});
  bad["identity"]["secret"] = "";
  EXPECT_EQ(DecodeAs<Auth>(bad).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeAs<Auth>(Json{{"secret", ""}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeAs<Auth>(Json::object()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeAs<Auth>(Json{{"secret", 7}}).status().code(), StatusCode::kInvalidArgument);
  Ready r = RoundTrip(Ready{1, 9});
  EXPECT_EQ(r.pid, 1);
  EXPECT_EQ(r.layer_fd, 9);
  // An older agent's ready said nothing of a layer: none.
  auto old = DecodeAs<Ready>(Json{{"pid", 1}});
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->layer_fd, -1);
  EXPECT_FALSE(DecodeAs<Ready>(Json{{"layer_fd", "x"}}).ok());
}

}  // namespace
}  // namespace dsec::protocol
