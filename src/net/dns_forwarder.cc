#include "net/dns_forwarder.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "base/ids.h"
#include "base/logging.h"
#include "base/strings.h"

namespace dsec::net {

namespace {

constexpr size_t kMaxPending = 512, kMaxPendingPerSource = 8;
constexpr int64_t kUpstreamTimeoutMs = 3000;
// While the upstream is unreachable, one query in this interval still goes to it (a probe).
constexpr int64_t kProbeIntervalMs = 2000;
// An address is allowed at least this long (when the cap allows), even for a TTL of 0: the
// sandbox connects right after the answer, and conntrack keeps the connection past it.
constexpr uint32_t kMinAllowedTtl = 60;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

sockaddr_in Sockaddr(uint32_t addr, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(addr);
  sa.sin_port = htons(port);
  return sa;
}

// An id for the upstream query: getrandom's, and never the sandbox's own (which the sandbox
// knows; one value fewer to guess costs nothing).
uint16_t UpstreamId(uint16_t client_id) {
  for (;;) {
    std::string r = RandomBytes(2);
    auto id = static_cast<uint16_t>(static_cast<uint8_t>(r[0]) << 8 | static_cast<uint8_t>(r[1]));
    if (id != client_id) return id;
  }
}

struct Pending {
  UniqueFd fd;  // connected to the upstream
  std::string query;
  dns::Question q;           // the sandbox's
  dns::Question upstream_q;  // the same with the forwarder's id
  sockaddr_in client{};
  bool allow = false;  // add the answer's addresses to the sandbox's allowed set
  int64_t deadline = 0;
};

}  // namespace

std::optional<uint32_t> FirstNameserver(const std::string& text) {
  for (auto line : SplitString(text, '\n', true)) {
    line = TrimWhitespace(line);
    if (!StartsWith(line, "nameserver")) continue;
    uint32_t a = 0;
    if (ParseIpv4(TrimWhitespace(line.substr(10)), &a)) return a;
  }
  return std::nullopt;
}

StatusOr<std::unique_ptr<DnsForwarder>> DnsForwarder::Start(uint32_t listen_addr, uint32_t upstream,
                                                            uint16_t upstream_port, PolicyFn policy,
                                                            AllowFn allow, Options options) {
  std::unique_ptr<DnsForwarder> f(new DnsForwarder());
  f->sock_.Reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!f->sock_) return ErrnoError("dns socket");
  sockaddr_in sa = Sockaddr(listen_addr, options.listen_port);
  if (bind(f->sock_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0)
    return ErrnoError("bind the sandbox DNS forwarder to " + Ipv4ToString(listen_addr) + ":" +
                      std::to_string(options.listen_port));
  socklen_t salen = sizeof sa;
  if (getsockname(f->sock_.get(), reinterpret_cast<sockaddr*>(&sa), &salen) < 0)
    return ErrnoError("getsockname of the sandbox DNS forwarder");
  f->port_ = ntohs(sa.sin_port);
  f->options_ = options;
  f->stop_.Reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!f->stop_) return ErrnoError("eventfd");
  f->upstream_ = Sockaddr(upstream, upstream_port);
  f->policy_ = std::move(policy);
  f->allow_ = std::move(allow);
  f->thread_ = std::thread([p = f.get()] { p->Loop(); });
  return f;
}

DnsForwarder::~DnsForwarder() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!write(stop_.get(), &one, sizeof one);
    thread_.join();
  }
}

void DnsForwarder::Loop() {
  std::vector<Pending> pending;
  std::map<uint32_t, size_t> per_source;
  auto reply = [&](const sockaddr_in& to, const std::string& msg) {
    (void)sendto(sock_.get(), msg.data(), msg.size(), MSG_DONTWAIT,
                 reinterpret_cast<const sockaddr*>(&to), sizeof to);
  };
  auto finish = [&](size_t i) {
    uint32_t src = ntohl(pending[i].client.sin_addr.s_addr);
    if (--per_source[src] == 0) per_source.erase(src);
    pending.erase(pending.begin() + static_cast<long>(i));
  };
  const std::string upstream_name = Ipv4ToString(ntohl(upstream_.sin_addr.s_addr)) + ":" +
                                    std::to_string(ntohs(upstream_.sin_port));
  int64_t next_probe = 0;   // while unreachable: when the next query may go upstream
  int64_t last_answer = 0;  // when the upstream last answered anything
  auto mark = [&](Upstream u, const char* why) {
    const auto old = static_cast<Upstream>(upstream_state_.exchange(static_cast<int>(u)));
    if (u == Upstream::kUnreachable && old != Upstream::kUnreachable) {
      DSEC_LOG_WARN(
          "dns: upstream {} {}: sandbox lookups fail at once (SERVFAIL) until it answers (a probe "
          "every {} s; set network_dns to another resolver)",
          upstream_name, why, kProbeIntervalMs / 1000);
      next_probe = NowMs() + kProbeIntervalMs;
    } else if (u == Upstream::kOk && old == Upstream::kUnreachable) {
      DSEC_LOG_INFO("dns: upstream {} answers again", upstream_name);
    }
  };
  char buf[4096];
  for (;;) {
    std::vector<pollfd> fds = {{stop_.get(), POLLIN, 0}, {sock_.get(), POLLIN, 0}};
    int64_t now = NowMs(), wait = 1000;
    for (const auto& p : pending) {
      fds.push_back({p.fd.get(), POLLIN, 0});
      wait = std::min(wait, std::max<int64_t>(0, p.deadline - now));
    }
    if (poll(fds.data(), fds.size(), static_cast<int>(wait)) < 0 && errno != EINTR) return;
    if (fds[0].revents) return;
    now = NowMs();
    // Upstream answers (and timeouts), newest index first so erasing keeps the rest valid.
    for (size_t i = pending.size(); i-- > 0;) {
      Pending& p = pending[i];
      if (fds[i + 2].revents & (POLLIN | POLLERR)) {
        ssize_t n = recv(p.fd.get(), buf, sizeof buf, 0);
        if (n < 0 && errno == ECONNREFUSED) {
          // Nothing listens there (ICMP port unreachable): no answer will come.
          mark(Upstream::kUnreachable, "refused the query (nothing listens there)");
          reply(p.client, dns::Reply(p.query, p.q, dns::kServFail));
          finish(i);
          continue;
        }
        if (n <= 0) continue;
        std::string_view ans(buf, static_cast<size_t>(n));
        auto a = dns::ParseAnswer(ans, p.upstream_q);
        if (!a) continue;  // not the answer to this query: keep waiting
        last_answer = now;
        mark(Upstream::kOk, "");
        const uint32_t max_ttl = options_.max_ttl_s;
        std::vector<dns::Address> addrs;
        for (const auto& r : a->addresses)
          addrs.push_back({r.address.addr,
                           std::clamp(r.address.ttl, std::min(kMinAllowedTtl, max_ttl), max_ttl)});
        if (p.allow && !addrs.empty()) allow_(ntohl(p.client.sin_addr.s_addr), addrs);
        if (p.q.type == dns::kTypeA) {
          // No bigger than the upstream's reply to the same query, which knew the sandbox's
          // EDNS buffer size (when it had one).
          reply(p.client, dns::BuildAnswer(p.query, p.q, *a, max_ttl, ans.size()));
        } else {
          // Nothing of it is allowed beyond the A records above; it goes back as it came.
          std::string out(ans);
          out[0] = static_cast<char>(p.q.id >> 8);
          out[1] = static_cast<char>(p.q.id & 0xff);
          reply(p.client, out);
        }
        answered_++;
        finish(i);
      } else if (now >= p.deadline) {
        // Unreachable only if nothing at all came back since this query went out: one lost
        // datagram on a busy node does not fail everyone's lookups.
        if (last_answer < p.deadline - kUpstreamTimeoutMs)
          mark(Upstream::kUnreachable, "did not answer in 3 s");
        reply(p.client, dns::Reply(p.query, p.q, dns::kServFail));
        finish(i);
      }
    }
    if (!(fds[1].revents & POLLIN)) continue;
    for (int batch = 0; batch < 64; ++batch) {
      sockaddr_in from{};
      socklen_t len = sizeof from;
      ssize_t n =
          recvfrom(sock_.get(), buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len);
      if (n < 0) break;
      std::string query(buf, static_cast<size_t>(n));
      auto q = dns::ParseQuery(query);
      uint32_t src = ntohl(from.sin_addr.s_addr);
      auto policy = q ? policy_(src) : std::nullopt;
      if (!policy || policy->mode == NetMode::kNone) {
        refused_++;
        continue;  // not a sandbox with a network: no answer at all
      }
      if (q->odd_label) {
        // REFUSED, not NXDOMAIN: nothing is said about whether such a name exists.
        reply(from, dns::Reply(query, *q, dns::kRefused));
        refused_++;
        continue;
      }
      bool listed = DomainAllowed(*policy, q->name);
      if (policy->mode == NetMode::kAllowlist && !listed) {
        reply(from, dns::Reply(query, *q, dns::kNxDomain));
        refused_++;
        continue;
      }
      if (q->type == dns::kTypeAAAA) {
        reply(from, dns::Reply(query, *q, dns::kNoError));
        continue;
      }
      if (pending.size() >= kMaxPending || per_source[src] >= kMaxPendingPerSource) {
        reply(from, dns::Reply(query, *q, dns::kServFail));
        continue;
      }
      if (upstream() == Upstream::kUnreachable) {
        if (now < next_probe) {
          reply(from, dns::Reply(query, *q, dns::kServFail));
          failed_fast_++;
          continue;
        }
        next_probe = now + kProbeIntervalMs;  // this one is the probe
      }
      Pending p;
      p.upstream_q = *q;
      p.upstream_q.id = UpstreamId(q->id);
      std::string upstream_query = query;
      upstream_query[0] = static_cast<char>(p.upstream_q.id >> 8);
      upstream_query[1] = static_cast<char>(p.upstream_q.id & 0xff);
      p.fd.Reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (!p.fd ||
          connect(p.fd.get(), reinterpret_cast<const sockaddr*>(&upstream_), sizeof upstream_) <
              0 ||
          send(p.fd.get(), upstream_query.data(), upstream_query.size(), 0) < 0) {
        reply(from, dns::Reply(query, *q, dns::kServFail));
        continue;
      }
      p.query = std::move(query);
      p.q = *q;
      p.client = from;
      p.allow = listed;
      p.deadline = now + kUpstreamTimeoutMs;
      per_source[src]++;
      pending.push_back(std::move(p));
    }
  }
}

}  // namespace dsec::net
