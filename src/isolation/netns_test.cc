#include "isolation/netns.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

namespace dsec::isolation {
namespace {

// Runs fn on a thread that entered ns.
template <typename F>
void InNs(int ns, F fn) {
  std::thread t([&] {
    ASSERT_EQ(setns(ns, CLONE_NEWNET), 0);
    fn();
  });
  t.join();
}

TEST(NetnsPrivilegedTest, LoopbackOnlyAndRecycledWhenQuiet) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces";
  NetnsPool pool(4);
  auto n = pool.Acquire();
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_TRUE(NetnsPool::IsQuiet(*n));
  int listener = -1;
  InNs(n->ns.get(), [&] {
    // Only lo exists, and it is up: a loopback server works.
    listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(8123);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(listen(listener, 1), 0);
    // Anything but loopback is unreachable.
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in out{};
    out.sin_family = AF_INET;
    out.sin_port = htons(80);
    out.sin_addr.s_addr = htonl(0x0a000001);  // 10.0.0.1, never actually reached: no route
    EXPECT_EQ(connect(c, reinterpret_cast<sockaddr*>(&out), sizeof out), -1);
    EXPECT_EQ(errno, ENETUNREACH);
    close(c);
  });
  EXPECT_FALSE(NetnsPool::IsQuiet(*n));  // a listening socket: not reusable yet
  int raw = n->ns.get();
  pool.Release(std::move(*n));
  EXPECT_EQ(pool.idle(), 0u);  // dropped, not pooled
  close(listener);
  (void)raw;

  auto m = pool.Acquire();
  ASSERT_TRUE(m.ok());
  pool.Release(std::move(*m));
  EXPECT_EQ(pool.idle(), 1u);  // quiet: kept
  auto again = pool.Acquire();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(pool.idle(), 0u);
}

}  // namespace
}  // namespace dsec::isolation
