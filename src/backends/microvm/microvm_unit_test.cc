// The microVM backend's pure parts: the initramfs archive, the QEMU command line, the
// adoption handle.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>

#include "backends/microvm/adoption_handle.h"
#include "backends/microvm/boot_files.h"
#include "backends/microvm/qemu_cmd.h"
#include "base/file_util.h"

namespace dsec::backends::microvm {
namespace {

TEST(CpioTest, ArchivesRoundTripWithAlignedMembers) {
  std::vector<CpioEntry> in = {{"dev", S_IFDIR | 0755, "", 0, 0},
                               {"dev/console", S_IFCHR | 0600, "", 5, 1},
                               {"init", S_IFREG | 0755,
                                std::string("\x7f"
                                            "ELF\0x",
                                            6),
                                0, 0},
                               {"lib/modules/a.ko", S_IFREG | 0644, std::string(4097, 'k'), 0, 0}};
  std::string a = CpioArchive(in);
  EXPECT_EQ(a.size() % 4, 0u);
  EXPECT_EQ(a.substr(0, 6), "070701");
  EXPECT_NE(a.find("TRAILER!!!"), std::string::npos);
  auto out = ParseCpio(a);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ((*out)[i].path, in[i].path);
    EXPECT_EQ((*out)[i].mode, in[i].mode);
    EXPECT_EQ((*out)[i].data, in[i].data);
    EXPECT_EQ((*out)[i].rdev_major, in[i].rdev_major);
    EXPECT_EQ((*out)[i].rdev_minor, in[i].rdev_minor);
  }
  // Truncated or foreign archives are refused.
  EXPECT_FALSE(ParseCpio(a.substr(0, a.size() / 2)).ok());
  EXPECT_FALSE(ParseCpio("not a cpio archive at all, really not one").ok());
}

TEST(CpioTest, InitramfsHoldsTheAgentAsInitAndTheModulesInOrder) {
  auto t = TempDir::Create("/tmp/dsec-initramfs-test-");
  ASSERT_TRUE(t.ok());
  std::string k = t->path() + "/6.1.0-test";
  ASSERT_TRUE(MakeDirs(k + "/modules").ok());
  ASSERT_TRUE(WriteStringToFile(k + "/vmlinux", "ELF", O_WRONLY | O_CREAT).ok());
  ASSERT_TRUE(WriteStringToFile(k + "/modules/b.ko", "bbb", O_WRONLY | O_CREAT).ok());
  ASSERT_TRUE(WriteStringToFile(k + "/modules/a.ko", "aa", O_WRONLY | O_CREAT).ok());
  ASSERT_TRUE(WriteStringToFile(k + "/modules/order", "b.ko\na.ko\n", O_WRONLY | O_CREAT).ok());
  ASSERT_TRUE(WriteStringToFile(t->path() + "/agent", "AGENT", O_WRONLY | O_CREAT).ok());
  auto kernel = FindGuestKernel(k);
  ASSERT_TRUE(kernel.ok()) << kernel.status().ToString();
  EXPECT_EQ(kernel->version, "6.1.0-test");
  EXPECT_EQ(kernel->modules, (std::vector<std::string>{"b.ko", "a.ko"}));
  std::string img = t->path() + "/initramfs.cpio";
  ASSERT_TRUE(WriteGuestInitramfs(*kernel, t->path() + "/agent", img).ok());
  struct stat st;
  ASSERT_EQ(stat(img.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  auto data = ReadFileToString(img, 1 << 20);
  ASSERT_TRUE(data.ok());
  auto entries = ParseCpio(*data);
  ASSERT_TRUE(entries.ok());
  auto find = [&](const std::string& p) -> const CpioEntry* {
    for (const auto& e : *entries)
      if (e.path == p) return &e;
    return nullptr;
  };
  ASSERT_NE(find("init"), nullptr);
  EXPECT_EQ(find("init")->data, "AGENT");
  EXPECT_EQ(find("init")->mode, static_cast<uint32_t>(S_IFREG | 0755));
  ASSERT_NE(find("dev/console"), nullptr);
  EXPECT_TRUE(S_ISCHR(find("dev/console")->mode));
  ASSERT_NE(find("lib/modules/order"), nullptr);
  EXPECT_EQ(find("lib/modules/order")->data, "b.ko\na.ko\n");
  EXPECT_EQ(find("lib/modules/a.ko")->data, "aa");
  for (const char* d : {"proc", "sys", "newroot", "layers", "rw"}) EXPECT_NE(find(d), nullptr) << d;

  // What is missing says how to get it.
  auto none = FindGuestKernel(t->path() + "/nope");
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("scripts/guest-kernel"), std::string::npos);
  ASSERT_TRUE(WriteStringToFile(k + "/modules/order", "../evil.ko\n", O_WRONLY | O_TRUNC).ok());
  EXPECT_FALSE(FindGuestKernel(k).ok());
}

std::string Arg(const std::vector<std::string>& a, const std::string& flag, size_t nth = 0) {
  for (size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i] == flag && nth-- == 0) return a[i + 1];
  return "";
}

TEST(QemuCmdTest, EverythingQemuTouchesIsADescriptorAndTheDisksAreReadOnly) {
  QemuConfig c;
  c.memory_mb = 768;
  c.disk_mb = 256;
  c.tsc_khz = 2596120;
  c.kernel_fd = 3, c.initrd_fd = 4, c.agent_listen_fd = 5, c.qmp_listen_fd = 6;
  c.layer_fds = {8, 9};
  auto a = QemuArgv(c);
  EXPECT_EQ(a[0], "qemu-system-x86_64");
  EXPECT_EQ(Arg(a, "-M"), "microvm,x-option-roms=off,rtc=on");
  EXPECT_EQ(Arg(a, "-accel"), "tcg,thread=single,tb-size=32");
  EXPECT_EQ(Arg(a, "-m"), "768M");
  EXPECT_EQ(Arg(a, "-kernel"), "/proc/self/fd/3");
  EXPECT_EQ(Arg(a, "-initrd"), "/proc/self/fd/4");
  EXPECT_EQ(Arg(a, "-chardev", 1), "socket,id=agent,fd=5,server=on,wait=off");
  EXPECT_EQ(Arg(a, "-chardev", 2), "socket,id=qmp,fd=6,server=on,wait=off");
  EXPECT_EQ(Arg(a, "-add-fd", 0), "fd=8,set=1");
  EXPECT_EQ(Arg(a, "-add-fd", 1), "fd=9,set=2");
  EXPECT_EQ(Arg(a, "-drive", 0),
            "file=/dev/fdset/1,if=none,id=layer0,format=raw,readonly=on,file.locking=off");
  EXPECT_EQ(Arg(a, "-sandbox"),
            "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
  EXPECT_NE(std::find(a.begin(), a.end(), "-nodefaults"), a.end());
  EXPECT_NE(std::find(a.begin(), a.end(), "dsec,debug-threads=on"), a.end());
  EXPECT_NE(std::find(a.begin(), a.end(), "-no-reboot"), a.end());
  // No network device, no host path, no monitor on stdio.
  for (const auto& s : a) {
    EXPECT_EQ(s.find("netdev"), std::string::npos) << s;
    EXPECT_EQ(s.find("mon:stdio"), std::string::npos) << s;
    EXPECT_EQ(s.find("path="), std::string::npos) << s;
  }
  std::string cmdline = Arg(a, "-append");
  EXPECT_NE(cmdline.find("tsc_early_khz=2596120"), std::string::npos);
  EXPECT_NE(cmdline.find("dsec.layers=2"), std::string::npos);
  EXPECT_NE(cmdline.find("dsec.disk_mb=256"), std::string::npos);
  EXPECT_NE(cmdline.find("panic=-1"), std::string::npos);

  // A template shares its RAM file (the memfd clones then map privately); a clone waits for
  // its state.
  EXPECT_EQ(std::find(a.begin(), a.end(), "-incoming"), a.end());
  c.ram_fd = 7;
  c.ram_shared = true;
  a = QemuArgv(c);
  EXPECT_EQ(Arg(a, "-M"), "microvm,x-option-roms=off,rtc=on,memory-backend=mem");
  EXPECT_EQ(Arg(a, "-object"),
            "memory-backend-file,id=mem,size=768M,mem-path=/proc/self/fd/7,share=on");
  c.ram_shared = false;
  c.incoming = true;
  a = QemuArgv(c);
  EXPECT_EQ(Arg(a, "-object"),
            "memory-backend-file,id=mem,size=768M,mem-path=/proc/self/fd/7,share=off");
  EXPECT_EQ(Arg(a, "-incoming"), "defer");
  // A fork: its own RAM under the name the stream it restores has.
  c.ram_fd = -1;
  c.ram_object = true;
  a = QemuArgv(c);
  EXPECT_EQ(Arg(a, "-M"), "microvm,x-option-roms=off,rtc=on,memory-backend=mem");
  EXPECT_EQ(Arg(a, "-object"), "memory-backend-ram,id=mem,size=768M");
  c.ram_object = false;
  c.ram_fd = 7;

  // A NIC only when asked for: a tap by descriptor, or (a template's) a hub port to nowhere.
  c.nic = Nic::kTap;
  c.tap_fd = 10;
  a = QemuArgv(c);
  EXPECT_EQ(Arg(a, "-netdev"), "tap,id=net0,fd=10");
  EXPECT_EQ(Arg(a, "-device", 4), "virtio-net-device,netdev=net0");  // after both disks
  c.nic = Nic::kUnplugged;
  a = QemuArgv(c);
  EXPECT_EQ(Arg(a, "-netdev"), "hubport,id=net0,hubid=0");
  EXPECT_EQ(Arg(a, "-device", 4), "virtio-net-device,netdev=net0");
  c.nic = Nic::kNone;

  c.accel = Accel::kKvm;
  c.seccomp = false;
  a = QemuArgv(c);
  EXPECT_EQ(Arg(a, "-accel"), "kvm");
  EXPECT_EQ(Arg(a, "-cpu"), "host");
  EXPECT_EQ(std::find(a.begin(), a.end(), "-sandbox"), a.end());
}

TEST(QemuCmdTest, HostTscIsReadFromCpuinfo) {
  // Every x86 Linux host reports a "cpu MHz"; the guest's TSC runs at its rate under TCG.
  EXPECT_GT(HostTscKhz(), 100000);
}

TEST(VmAdoptionHandleTest, RoundTripsEveryField) {
  VmAdoptionHandle h;
  h.secret = "feedface";
  h.uid_slot = 7;
  h.qemu_pid = 4242;
  h.layer_digests = {"sha256:aa", "sha256:bb"};
  h.net_addr = 0x0ad50007;
  h.net_if = "dsvabc12300000001";
  h.net_if.resize(15);
  auto back = VmAdoptionHandle::Parse(h.Encode());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->secret, h.secret);
  EXPECT_EQ(back->uid_slot, 7);
  EXPECT_EQ(back->qemu_pid, 4242);
  EXPECT_EQ(back->layer_digests, h.layer_digests);
  EXPECT_EQ(back->net_addr, 0x0ad50007u);
  EXPECT_EQ(back->net_if, h.net_if);
  // What the edges before the typed handle wrote is the same shape.
  auto old = VmAdoptionHandle::Parse(R"({"secret":"s","uid_slot":-1,"qemu_pid":9,"layers":[]})");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->uid_slot, -1);
  EXPECT_TRUE(old->layer_digests.empty());
  EXPECT_TRUE(VmAdoptionHandle::Parse(R"({"secret":"s","qemu_pid":9,"future":{}})").ok());
}

TEST(VmAdoptionHandleTest, BadHandlesAreErrors) {
  for (const char* bad : {"", "[]", "{}", R"({"secret":"","qemu_pid":9})", R"({"secret":"s"})",
                          R"({"secret":"s","qemu_pid":0})", R"({"secret":"s","qemu_pid":"9"})",
                          R"({"secret":"s","qemu_pid":9,"uid_slot":-2})",
                          R"({"secret":"s","qemu_pid":9,"layers":"sha256:aa"})",
                          R"({"secret":"s","qemu_pid":9,"layers":[1]})",
                          R"({"secret":"s","qemu_pid":9,"net_addr":7})",
                          R"({"secret":"s","qemu_pid":9,"net_addr":-1,"net_if":"t"})"}) {
    auto h = VmAdoptionHandle::Parse(bad);
    EXPECT_FALSE(h.ok()) << bad;
    if (!h.ok()) {
      EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument) << bad;
    }
  }
}

}  // namespace
}  // namespace dsec::backends::microvm
