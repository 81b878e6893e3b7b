// cluster_load: bench/cluster_scale's load generator (issue 38). Keeps C keep-alive
// connections to the apiservers (spread round robin over the --url list) and sends POST
// /v1/sandboxes on each as soon as the last answer came (closed loop), for --seconds or until
// --total creates were placed (201). One epoll thread per --threads.
//
// Prints one JSON object: placed, by status, seconds, rate, latency percentiles (ms), the ids
// seen twice (a placement that made a duplicate), and errors (connections lost).
//
//   cluster_load --url http://127.0.0.1:7080 --url http://127.0.0.1:7081 --token T
//                   --connections 256 --seconds 10 [--total N] [--body '{"memory_mb":64}']
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "base/json.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Target {
  std::string host;
  uint16_t port = 0;
};

struct Options {
  std::vector<Target> targets;
  std::string token;
  std::string body = R"({"memory_mb":64,"cpu":0.1})";
  int connections = 128;
  int threads = 1;
  double seconds = 10;
  int64_t total = 0;  // 0: no cap
};

struct Conn {
  int fd = -1;
  size_t target = 0;
  std::string out;
  size_t sent = 0;
  std::string in;
  Clock::time_point started;
};

struct Stats {
  int64_t placed = 0;
  std::map<int, int64_t> by_status;
  std::vector<uint32_t> latency_us;
  int64_t errors = 0;
  std::vector<std::string> ids;
};

std::atomic<int64_t> g_placed{0};
std::atomic<bool> g_stop{false};

int Connect(const Target& t) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(t.port);
  inet_pton(AF_INET, t.host.c_str(), &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) < 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

// A whole response in `in`: its status, and where it ends (0: not yet complete).
size_t Complete(const std::string& in, int* status, bool* close_after) {
  size_t head_end = in.find("\r\n\r\n");
  if (head_end == std::string::npos) return 0;
  *status = std::atoi(in.c_str() + 9);
  size_t length = 0;
  *close_after = false;
  size_t pos = in.find("\r\n") + 2;
  while (pos < head_end) {
    size_t eol = in.find("\r\n", pos);
    std::string line = in.substr(pos, eol - pos);
    std::transform(line.begin(), line.end(), line.begin(), ::tolower);
    if (line.rfind("content-length:", 0) == 0) length = std::stoull(line.substr(15));
    if (line.rfind("connection:", 0) == 0 && line.find("close") != std::string::npos)
      *close_after = true;
    pos = eol + 2;
  }
  size_t end = head_end + 4 + length;
  return in.size() >= end ? end : 0;
}

void Worker(const Options& o, int first, int count, Stats* st) {
  int ep = epoll_create1(EPOLL_CLOEXEC);
  std::vector<Conn> conns(count);
  std::string request_tail = "Content-Type: application/json\r\nAuthorization: Bearer " + o.token +
                             "\r\nContent-Length: " + std::to_string(o.body.size()) + "\r\n\r\n" +
                             o.body;
  auto start_request = [&](Conn& c) {
    const Target& t = o.targets[c.target];
    c.out = "POST /v1/sandboxes HTTP/1.1\r\nHost: " + t.host + ":" + std::to_string(t.port) +
            "\r\n" + request_tail;
    c.sent = 0;
    c.started = Clock::now();
  };
  // Once stopped, no new request goes; those in flight are waited for (at most 30 s), so that
  // every create a node made is counted.
  int in_flight = count;
  auto open_conn = [&](int i) {
    Conn& c = conns[i];
    c.fd = Connect(o.targets[c.target]);
    if (c.fd < 0) {
      --in_flight;  // (this connection takes no part any more)
      return false;
    }
    c.in.clear();
    start_request(c);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.u32 = static_cast<uint32_t>(i);
    epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &ev);
    return true;
  };
  for (int i = 0; i < count; ++i) {
    conns[i].target = static_cast<size_t>(first + i) % o.targets.size();
    if (!open_conn(i)) ++st->errors;
  }
  std::vector<epoll_event> events(256);
  char buf[65536];
  Clock::time_point drain_until{};
  for (;;) {
    if (g_stop.load(std::memory_order_relaxed)) {
      if (drain_until == Clock::time_point{}) drain_until = Clock::now() + std::chrono::seconds(30);
      if (in_flight == 0 || Clock::now() > drain_until) break;
    }
    int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 50);
    for (int k = 0; k < n; ++k) {
      const int i = static_cast<int>(events[k].data.u32);
      Conn& c = conns[i];
      bool broken = (events[k].events & (EPOLLERR | EPOLLHUP)) != 0;
      if (!broken && (events[k].events & EPOLLOUT) && c.sent < c.out.size()) {
        ssize_t w = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (w > 0)
          c.sent += static_cast<size_t>(w);
        else if (w < 0 && errno != EAGAIN)
          broken = true;
        if (c.sent == c.out.size()) {
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.u32 = static_cast<uint32_t>(i);
          epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &ev);
        }
      }
      if (!broken && (events[k].events & EPOLLIN)) {
        for (;;) {
          ssize_t r = recv(c.fd, buf, sizeof(buf), 0);
          if (r > 0) {
            c.in.append(buf, static_cast<size_t>(r));
            continue;
          }
          if (r == 0 || errno != EAGAIN) broken = true;
          break;
        }
        int status = 0;
        bool close_after = false;
        size_t end = Complete(c.in, &status, &close_after);
        if (end > 0) {
          auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - c.started)
                        .count();
          st->latency_us.push_back(static_cast<uint32_t>(us));
          st->by_status[status]++;
          if (status == 201) {
            ++st->placed;
            size_t p = c.in.find("\"id\":\"");
            if (p != std::string::npos && p < end) {
              size_t q = c.in.find('"', p + 6);
              st->ids.push_back(c.in.substr(p + 6, q - p - 6));
            }
            if (o.total > 0 && g_placed.fetch_add(1) + 1 >= o.total) g_stop = true;
          }
          c.in.erase(0, end);
          if (g_stop.load(std::memory_order_relaxed)) {  // draining: this one is done
            --in_flight;
            epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
            close(c.fd);
            c.fd = -1;
            continue;
          }
          if (close_after || broken) {
            broken = true;
          } else {
            start_request(c);
            epoll_event ev{};
            ev.events = EPOLLIN | EPOLLOUT;
            ev.data.u32 = static_cast<uint32_t>(i);
            epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &ev);
            broken = false;
          }
          if (broken) {
            epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
            close(c.fd);
            if (!open_conn(i)) ++st->errors;
          }
          continue;
        }
      }
      if (broken) {
        ++st->errors;
        epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
        close(c.fd);
        c.fd = -1;
        if (g_stop.load(std::memory_order_relaxed)) {  // (its answer is lost)
          --in_flight;
          continue;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (!open_conn(i)) ++st->errors;
      }
    }
  }
  for (auto& c : conns)
    if (c.fd >= 0) close(c.fd);
  close(ep);
}

bool ParseUrl(const std::string& url, Target* t) {
  if (url.rfind("http://", 0) != 0) return false;
  std::string rest = url.substr(7);
  size_t colon = rest.find(':');
  if (colon == std::string::npos) return false;
  t->host = rest.substr(0, colon);
  t->port = static_cast<uint16_t>(std::stoi(rest.substr(colon + 1)));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--url") {
      Target t;
      if (!ParseUrl(v, &t)) {
        std::fprintf(stderr, "cluster_load: --url http://IP:PORT, not %s\n", v.c_str());
        return 2;
      }
      o.targets.push_back(t);
    } else if (k == "--token") {
      o.token = v;
    } else if (k == "--connections") {
      o.connections = std::stoi(v);
    } else if (k == "--threads") {
      o.threads = std::stoi(v);
    } else if (k == "--seconds") {
      o.seconds = std::stod(v);
    } else if (k == "--total") {
      o.total = std::stoll(v);
    } else if (k == "--body") {
      o.body = v;
    } else {
      std::fprintf(stderr, "cluster_load: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (o.targets.empty() || o.token.empty()) {
    std::fprintf(stderr,
                 "usage: cluster_load --url http://IP:PORT [--url ...] --token T "
                 "[--connections C] [--threads T] [--seconds S] [--total N] [--body J]\n");
    return 2;
  }
  o.threads = std::max(1, std::min(o.threads, o.connections));
  std::vector<Stats> stats(static_cast<size_t>(o.threads));
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  int first = 0;
  for (int t = 0; t < o.threads; ++t) {
    int count = o.connections / o.threads + (t < o.connections % o.threads);
    threads.emplace_back(Worker, std::cref(o), first, count, &stats[static_cast<size_t>(t)]);
    first += count;
  }
  while (!g_stop && Clock::now() - t0 < std::chrono::duration<double>(o.seconds))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  g_stop = true;
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  Stats all;
  std::unordered_set<std::string> seen;
  int64_t dup = 0;
  for (auto& s : stats) {
    all.placed += s.placed;
    all.errors += s.errors;
    for (auto [k, v] : s.by_status) all.by_status[k] += v;
    all.latency_us.insert(all.latency_us.end(), s.latency_us.begin(), s.latency_us.end());
    for (auto& id : s.ids) dup += !seen.insert(id).second;
  }
  std::sort(all.latency_us.begin(), all.latency_us.end());
  auto pct = [&](double p) {
    if (all.latency_us.empty()) return 0.0;
    size_t i = std::min(all.latency_us.size() - 1,
                        static_cast<size_t>(p * static_cast<double>(all.latency_us.size())));
    return all.latency_us[i] / 1000.0;
  };
  dsec::Json by = dsec::Json::object();
  for (auto [k, v] : all.by_status) by[std::to_string(k)] = v;
  dsec::Json out = {{"placed", all.placed}, {"seconds", secs},      {"rate", all.placed / secs},
                    {"by_status", by},      {"p50_ms", pct(0.5)},   {"p99_ms", pct(0.99)},
                    {"duplicates", dup},    {"errors", all.errors}, {"connections", o.connections}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
