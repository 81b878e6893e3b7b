#include "protocol/messages.h"

#include <gtest/gtest.h>

namespace dsec::protocol {
namespace {

TEST(MessagesTest, ExecSpecRoundTrip) {
  ExecSpec s;
  s.argv = {"python3", "-c", "print(1)"};
  s.env = {"PATH=/usr/bin", "HOME=/workspace"};
  s.cwd = "/workspace";
  s.timeout_ms = 1500;
  s.stdin_data = std::string("a\0b", 3);
  s.tty = true;
  s.cols = 120;
  auto back = ExecSpecFromJson(ToJson(s));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->argv, s.argv);
  EXPECT_EQ(back->env, s.env);
  EXPECT_EQ(back->stdin_data, s.stdin_data);
  EXPECT_EQ(back->timeout_ms, 1500);
  EXPECT_TRUE(back->tty);
  EXPECT_EQ(back->cols, 120);
}

TEST(MessagesTest, ExecSpecRejectsBadInput) {
  EXPECT_FALSE(ExecSpecFromJson(Json::parse(R"({"argv": []})")).ok());
  EXPECT_FALSE(ExecSpecFromJson(Json::parse(R"({"argv": "ls"})")).ok());
  EXPECT_FALSE(ExecSpecFromJson(Json::parse(R"({"argv": ["ls"], "uid": -1})")).ok());
  EXPECT_FALSE(ExecSpecFromJson(Json::parse(R"({"argv": ["ls"], "uid": 70000})")).ok());
  EXPECT_FALSE(ExecSpecFromJson(Json::parse(R"({"argv": ["ls"], "timeout_ms": "1"})")).ok());
  EXPECT_FALSE(ExecSpecFromJson(Json::parse(R"({"argv": ["ls"], "stdin_b64": "!!"})")).ok());
  EXPECT_FALSE(ExecSpecFromJson(Json::parse(R"([1,2])")).ok());
  EXPECT_FALSE(ParseJson("{not json").ok());
}

TEST(MessagesTest, SetupSpecRoundTrip) {
  SetupSpec s;
  s.sandbox_id = "sb-n-1";
  s.hostname = "sb-n-1";
  s.secret = "ab";
  s.rootfs.overlays.push_back({"/usr", {0, 1}});
  s.rootfs.symlinks.push_back({"/bin", "usr/bin"});
  s.rootfs.dirs.push_back({"/workspace", 0755, 1000, 1000});
  s.rootfs.files.push_back({"/etc/hosts", "127.0.0.1 localhost\n", 0644, 0, 0});
  s.rootfs.proc_views = {"meminfo", "uptime"};
  s.seccomp = {std::string("\x01\x02\x00", 3)};
  s.fds = {0, 1, 2, 3, 2};
  s.fds.first_proc_view = 5;
  auto back = SetupSpecFromJson(ToJson(s));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->rootfs.overlays[0].lower_fds, (std::vector<int>{0, 1}));
  EXPECT_EQ(back->rootfs.dirs[0].uid, 1000u);
  EXPECT_EQ(back->rootfs.files[0].content, "127.0.0.1 localhost\n");
  EXPECT_EQ(back->seccomp, s.seccomp);
  EXPECT_EQ(back->fds.layer_count, 2);
  EXPECT_EQ(back->rootfs.proc_views, s.rootfs.proc_views);
  EXPECT_EQ(back->fds.first_proc_view, 5);
}

TEST(MessagesTest, GuestSetupCarriesTheNicOrNone) {
  GuestSetup s;
  s.sandbox_id = s.hostname = "sb-vm-1";
  s.secret = "ab";
  s.net_address = "10.213.0.7";
  s.net_gateway = "10.213.0.1";
  auto back = GuestSetupFromJson(ToJson(s));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->net_address, "10.213.0.7");
  EXPECT_EQ(back->net_gateway, "10.213.0.1");
  Json j = ToJson(s);
  j.erase("net_address");
  j.erase("net_gateway");
  back = GuestSetupFromJson(j);  // an older edge's setup: no NIC
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->net_address.empty());
  j["net_address"] = "10.213.0.7";  // an address without its gateway
  EXPECT_FALSE(GuestSetupFromJson(j).ok());
  j["net_gateway"] = "10.213.0.1.1.1.1.1.1";
  EXPECT_FALSE(GuestSetupFromJson(j).ok());
}

TEST(MessagesTest, GuestSetupSaysWhetherItPreparesATemplate) {
  GuestSetup s;
  s.sandbox_id = s.hostname = "tmpl-1";
  s.files = {{"/etc/hostname", "localhost\n", 0644, 0, 0}};
  EXPECT_FALSE(GuestSetupFromJson(ToJson(s))->prepare);
  EXPECT_EQ(GuestSetupFromJson(ToJson(s))->pids, 0);  // no limit
  s.pids = 64;
  EXPECT_EQ(GuestSetupFromJson(ToJson(s))->pids, 64);
  s.prepare = true;
  auto back = GuestSetupFromJson(ToJson(s));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->prepare);
  ASSERT_EQ(back->files.size(), 1u);
  Json j = ToJson(s);
  j.erase("prepare");  // an older edge's setup: a sandbox's
  EXPECT_FALSE(GuestSetupFromJson(j)->prepare);
  j["prepare"] = "yes";
  EXPECT_FALSE(GuestSetupFromJson(j).ok());
}

TEST(MessagesTest, ErrorsCarryCodes) {
  Status s = StatusFromJson(ErrorJson(NotFound("no such file")));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "no such file");
  EXPECT_EQ(StatusFromJson(Json::parse(R"({"error": {"code": 5}})")).code(), StatusCode::kInternal);
  EXPECT_TRUE(StatusFromJson(Json::parse(R"({"ok": true})")).ok());
}

}  // namespace
}  // namespace dsec::protocol
