#include "net/egress_guard.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "base/logging.h"
#include "sys/bpf.h"

namespace dsec::net {

namespace {

using namespace dsec::bpf;  // NOLINT(google-build-using-namespace): the assembler

// The trie's key: {prefix length, owner, destination}, both addresses in network byte order;
// owner 0: the node-wide verdicts, a sandbox's address: its own.
struct TrieKey {
  uint32_t prefixlen;
  uint32_t owner;
  uint32_t dst;
};
// Node-wide verdicts (values of owner 0's entries).
enum : uint32_t { kRefuse = 1, kRefuseButDns = 2, kPrivate = 3 };
// A sandbox's entries say "allowed" by being there.
constexpr uint32_t kAllowed = 1;

// A sandbox's entry in the slot table, keyed by its cgroup id. Modes: not set yet (everything but
// loopback refused: fail closed), none (no network device: the kernel answers, ENETUNREACH, as for
// a sandbox created without one), networked.
enum : uint32_t { kUnset = 0, kNoNetwork = 1, kNetworked = 2 };
struct Slot {
  uint32_t mode;
  uint32_t addr;  // network byte order
  uint64_t denied;
  uint64_t next_log_ns;  // the rate limit's theoretical arrival time
};

// A refusal, as the programs put it in the ring buffer.
struct Event {
  uint32_t src, dst;  // network byte order
  uint32_t port;      // the context's user_port: network byte order in the low 16 bits
  uint32_t proto;
  uint32_t family;  // 4, or 6 for an IPv6 destination that is not v4-mapped (dst 0)
};

// The node's entry: refusals of all, and the depth of sandbox cgroups in the hierarchy.
struct NodeEntry {
  uint64_t total;
  uint32_t level;
  uint32_t pad;
};

constexpr uint64_t kLogEveryNs = 10'000'000'000;  // one a 10 s
constexpr uint64_t kLogBurst = 5;
// Entries are allocated as used; the bounds only cap what a node may hold: the node-wide
// verdicts, and per networked sandbox (65,536 at most) the rules that name private networks
// (kMaxRules at most, few in practice).
constexpr uint32_t kSlots = 65536;
constexpr uint32_t kTrieEntries = 1u << 22;
constexpr uint32_t kRingBytes = 64 * 1024;

constexpr bpf_attach_type kTypes[4] = {BPF_CGROUP_INET4_CONNECT, BPF_CGROUP_UDP4_SENDMSG,
                                       BPF_CGROUP_INET6_CONNECT, BPF_CGROUP_UDP6_SENDMSG};
constexpr const char* kNames[4] = {"connect4", "sendmsg4", "connect6", "sendmsg6"};

// offsetof(struct bpf_sock_addr, ...)
constexpr int16_t kUserIp4 = 4, kUserIp6 = 8, kUserPort = 24, kProtocol = 36;

// The program of one hook; `v6`: its context carries an IPv6 destination. Attached to the
// sandboxes' parent cgroup, it finds the caller's sandbox by its ancestor at the sandboxes'
// level; a process of no sandbox with a slot is not its business.
std::vector<bpf_insn> GuardProgram(bool v6, int trie, int slots, int node, int events) {
  enum { kCheck, kAllow, kDeny, kDns, kHave, kRate, kOut };
  // r6 ctx, r7 the sandbox's slot, r8 the destination (IPv4, network order), r9 its address.
  // Stack: -16..-4 the trie key, -20 a u32 key 0, -24 the destination's family, -32 the
  // sandbox's cgroup id, -56 an Event.
  Program p;
  p << MovReg(R6, R1) << StoreImm(BPF_W, R10, -20, 0);
  p.LoadMap(R1, node);
  p << MovReg(R2, R10) << AddImm(R2, -20) << Call(BPF_FUNC_map_lookup_elem);
  p.JumpImm(BPF_JEQ, R0, 0, kAllow);
  p << Load(BPF_W, R1, R0, offsetof(NodeEntry, level))
    << Call(BPF_FUNC_get_current_ancestor_cgroup_id);
  p.JumpImm(BPF_JEQ, R0, 0, kAllow);
  p << Store(BPF_DW, R10, R0, -32);
  p.LoadMap(R1, slots);
  p << MovReg(R2, R10) << AddImm(R2, -32) << Call(BPF_FUNC_map_lookup_elem);
  p.JumpImm(BPF_JEQ, R0, 0, kAllow);
  p << MovReg(R7, R0);
  if (!v6) {
    p << Load(BPF_W, R8, R6, kUserIp4) << StoreImm(BPF_W, R10, -24, 4);
    p.Goto(kCheck);
  } else {
    p << StoreImm(BPF_W, R10, -24, 6) << Load(BPF_W, R2, R6, kUserIp6)
      << Load(BPF_W, R3, R6, kUserIp6 + 4) << OrReg(R2, R3) << Load(BPF_W, R4, R6, kUserIp6 + 8)
      << Load(BPF_W, R8, R6, kUserIp6 + 12);
    p.JumpImm(BPF_JNE, R2, 0, kDeny);
    p.JumpImm32(BPF_JEQ, R4, static_cast<int32_t>(htonl(0xffff)), kCheck);  // ::ffff:a.b.c.d
    p.JumpImm(BPF_JNE, R4, 0, kDeny);
    p.JumpImm(BPF_JEQ, R8, 0, kAllow);                                 // ::
    p.JumpImm32(BPF_JEQ, R8, static_cast<int32_t>(htonl(1)), kAllow);  // ::1
    p.Goto(kDeny);
  }
  p.Place(kCheck) << StoreImm(BPF_W, R10, -24, 4) << MovReg(R1, R8) << AndImm(R1, 0xff);
  p.JumpImm(BPF_JEQ, R1, 127, kAllow);  // its own loopback
  p.JumpImm(BPF_JEQ, R1, 0, kAllow);    // 0.0.0.0: itself too
  p << Load(BPF_W, R1, R7, offsetof(Slot, mode));
  p.JumpImm(BPF_JEQ, R1, kUnset, kDeny);
  p.JumpImm(BPF_JEQ, R1, kNoNetwork, kAllow);
  p << Load(BPF_W, R9, R7, offsetof(Slot, addr));
  p.JumpReg(BPF_JEQ, R8, R9, kAllow);
  p << StoreImm(BPF_W, R10, -16, 64) << StoreImm(BPF_W, R10, -12, 0) << Store(BPF_W, R10, R8, -8);
  p.LoadMap(R1, trie);
  p << MovReg(R2, R10) << AddImm(R2, -16) << Call(BPF_FUNC_map_lookup_elem);
  p.JumpImm(BPF_JEQ, R0, 0, kAllow);  // nothing the node refuses
  p << Load(BPF_W, R1, R0, 0);
  p.JumpImm(BPF_JEQ, R1, kRefuse, kDeny);
  p.JumpImm(BPF_JEQ, R1, kRefuseButDns, kDns);
  // Private: allowed if one of its rules names the network.
  p << Store(BPF_W, R10, R9, -12);
  p.LoadMap(R1, trie);
  p << MovReg(R2, R10) << AddImm(R2, -16) << Call(BPF_FUNC_map_lookup_elem);
  p.JumpImm(BPF_JEQ, R0, 0, kDeny);
  p.Goto(kAllow);
  p.Place(kDns) << Load(BPF_W, R1, R6, kProtocol);
  p.JumpImm(BPF_JNE, R1, IPPROTO_UDP, kDeny);
  p << Load(BPF_W, R1, R6, kUserPort);
  p.JumpImm(BPF_JNE, R1, htons(53), kDeny);
  p.Place(kAllow) << MovImm(R0, 1) << Exit();

  // Refused: counted, and now and then logged.
  p.Place(kDeny) << MovImm(R1, 1) << AtomicAddDw(R7, R1, offsetof(Slot, denied));
  p.LoadMap(R1, node);
  p << MovReg(R2, R10) << AddImm(R2, -20) << Call(BPF_FUNC_map_lookup_elem);
  p.JumpImm(BPF_JEQ, R0, 0, kRate);
  p << MovImm(R1, 1) << AtomicAddDw(R0, R1, offsetof(NodeEntry, total));
  p.Place(kRate) << Call(BPF_FUNC_ktime_get_ns) << MovReg(R1, R0)
                 << Load(BPF_DW, R2, R7, offsetof(Slot, next_log_ns));
  p.JumpReg(BPF_JGE, R2, R1, kHave);
  p << MovReg(R2, R1);
  p.Place(kHave) << MovReg(R3, R2) << SubReg(R3, R1);  // how far ahead the bucket runs
  p.LoadImm64(R4, (kLogBurst - 1) * kLogEveryNs);
  p.JumpReg(BPF_JGT, R3, R4, kOut);
  p.LoadImm64(R4, kLogEveryNs);
  p << Insn(BPF_ALU64 | BPF_ADD | BPF_X, R2, R4, 0, 0)
    << Store(BPF_DW, R7, R2, offsetof(Slot, next_log_ns))
    << Load(BPF_W, R1, R7, offsetof(Slot, addr)) << Store(BPF_W, R10, R1, -56 + 0)
    << Store(BPF_W, R10, R8, -56 + 4) << Load(BPF_W, R1, R6, kUserPort)
    << Store(BPF_W, R10, R1, -56 + 8) << Load(BPF_W, R1, R6, kProtocol)
    << Store(BPF_W, R10, R1, -56 + 12) << Load(BPF_W, R1, R10, -24)
    << Store(BPF_W, R10, R1, -56 + 16);
  p.LoadMap(R1, events);
  p << MovReg(R2, R10) << AddImm(R2, -56) << MovImm(R3, sizeof(Event)) << MovImm(R4, 0)
    << Call(BPF_FUNC_ringbuf_output);
  p.Place(kOut) << MovImm(R0, 0) << Exit();
  return p.insns();
}

}  // namespace

StatusOr<std::unique_ptr<EgressGuard>> EgressGuard::Start(EgressGuardOptions o) {
  std::unique_ptr<EgressGuard> g(new EgressGuard(std::move(o)));
  DSEC_RETURN_IF_ERROR(g->Load());
  DSEC_RETURN_IF_ERROR(g->SetGlobal());
  g->thread_ = std::thread([p = g.get()] { p->Loop(); });
  return g;
}

Status EgressGuard::Load() {
  DSEC_ASSIGN_OR_RETURN(trie_, CreateMap(BPF_MAP_TYPE_LPM_TRIE, sizeof(TrieKey), sizeof(uint32_t),
                                         kTrieEntries, BPF_F_NO_PREALLOC, "egress trie"));
  DSEC_ASSIGN_OR_RETURN(slots_, CreateMap(BPF_MAP_TYPE_HASH, sizeof(uint64_t), sizeof(Slot), kSlots,
                                          BPF_F_NO_PREALLOC, "egress slots"));
  DSEC_ASSIGN_OR_RETURN(node_, CreateMap(BPF_MAP_TYPE_ARRAY, sizeof(uint32_t), sizeof(NodeEntry), 1,
                                         0, "egress node entry"));
  DSEC_ASSIGN_OR_RETURN(events_,
                        CreateMap(BPF_MAP_TYPE_RINGBUF, 0, 0, kRingBytes, 0, "egress events"));
  for (int i = 0; i < 4; ++i) {
    DSEC_ASSIGN_OR_RETURN(progs_[i], LoadProgram(BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
                                                 GuardProgram(i >= 2, trie_.get(), slots_.get(),
                                                              node_.get(), events_.get()),
                                                 kTypes[i], kNames[i]));
    DSEC_ASSIGN_OR_RETURN(prog_ids_[i], ProgramId(progs_[i].get()));
  }
  page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  ring_size_ = kRingBytes;
  consumer_ = mmap(nullptr, page_, PROT_READ | PROT_WRITE, MAP_SHARED, events_.get(), 0);
  if (consumer_ == MAP_FAILED) {
    consumer_ = nullptr;
    return ErrnoError("mmap the egress ring buffer's consumer page");
  }
  // The producer page, then the data twice over (a record may wrap).
  producer_ = mmap(nullptr, page_ + 2 * ring_size_, PROT_READ, MAP_SHARED, events_.get(),
                   static_cast<off_t>(page_));
  if (producer_ == MAP_FAILED) {
    producer_ = nullptr;
    return ErrnoError("mmap the egress ring buffer");
  }
  return OkStatus();
}

Status EgressGuard::SetGlobal() {
  auto put = [&](Ipv4Net n, uint32_t verdict) {
    TrieKey k{32u + n.prefix, 0, htonl(n.base)};
    return UpdateElem(trie_.get(), &k, &verdict, BPF_ANY, "egress trie");
  };
  for (const Ipv4Net& n : kPrivateNets) DSEC_RETURN_IF_ERROR(put(n, kPrivate));
  for (const Ipv4Net& n : kNeverNets)
    if (n.base != 0 && n.base != 0x7f000000) DSEC_RETURN_IF_ERROR(put(n, kRefuse));
  DSEC_RETURN_IF_ERROR(put(opts_.range, kRefuse));
  DSEC_RETURN_IF_ERROR(put({opts_.range.gateway(), 32}, kRefuseButDns));
  for (uint32_t a : opts_.node_addrs)
    if ((a >> 24) != 127 && a != 0 && a != opts_.range.gateway())
      DSEC_RETURN_IF_ERROR(put({a, 32}, kRefuse));
  return OkStatus();
}

EgressGuard::~EgressGuard() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (consumer_) munmap(consumer_, page_);
  if (producer_) munmap(producer_, page_ + 2 * ring_size_);
  // The programs stay on the parents they hold until a later edge replaces them or the parent
  // goes: sandboxes this edge let go of (an adopting edge's) keep the layer meanwhile.
}

namespace {

// The depth of a cgroup2 directory below its hierarchy's root (the root: 0).
StatusOr<uint32_t> CgroupLevel(int cgroup_fd) {
  struct stat st;
  if (fstat(cgroup_fd, &st) < 0) return ErrnoError("fstat cgroup");
  UniqueFd at(fcntl(cgroup_fd, F_DUPFD_CLOEXEC, 0));
  for (uint32_t level = 0; level < 64; ++level) {
    UniqueFd up(openat(at.get(), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    struct stat ust;
    if (!up || fstat(up.get(), &ust) < 0) return ErrnoError("open a cgroup's parent");
    if (ust.st_dev != st.st_dev) return level;  // `at` is the root of the hierarchy
    at = std::move(up);
  }
  return InternalError("a cgroup 64 levels deep");
}

}  // namespace

Status EgressGuard::Attach(int cgroup_fd) {
  DSEC_ASSIGN_OR_RETURN(uint64_t id, CgroupId(cgroup_fd));
  UniqueFd parent(openat(cgroup_fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!parent) return ErrnoError("open the sandbox cgroup's parent");
  DSEC_ASSIGN_OR_RETURN(uint64_t parent_id, CgroupId(parent.get()));
  MutexLock l(mu_);
  if (!parents_.count(parent_id)) {
    DSEC_ASSIGN_OR_RETURN(uint32_t level, CgroupLevel(cgroup_fd));
    // On the hierarchy's root the programs would run for every process of the host.
    if (level < 2) return FailedPrecondition("sandbox cgroups sit right below the cgroup2 root");
    if (level_ && level != level_)
      return FailedPrecondition("sandbox cgroups at depth " + std::to_string(level) +
                                " where earlier ones were at " + std::to_string(level_));
    NodeEntry e{};
    uint32_t k = 0;
    DSEC_RETURN_IF_ERROR(bpf::LookupElem(node_.get(), &k, &e).status());
    e.level = level;
    DSEC_RETURN_IF_ERROR(UpdateElem(node_.get(), &k, &e, BPF_ANY, "egress node entry"));
    level_ = level;
    for (int i = 0; i < 4; ++i) {
      DSEC_ASSIGN_OR_RETURN(std::vector<uint32_t> ids, AttachedPrograms(parent.get(), kTypes[i]));
      if (std::find(ids.begin(), ids.end(), prog_ids_[i]) == ids.end())
        DSEC_RETURN_IF_ERROR(AttachToCgroup(parent.get(), progs_[i].get(), kTypes[i], kNames[i]));
      // An earlier edge's programs (their maps are out of this edge's reach) go, once ours
      // hold; its sandboxes are guarded by ours as each is adopted (until then nftables alone).
      for (uint32_t old : ids)
        if (old != prog_ids_[i])
          DSEC_RETURN_IF_ERROR(DetachFromCgroup(parent.get(), old, kTypes[i]));
    }
    parents_.insert(parent_id);
  }
  // Everything but loopback refused until Set (an earlier Set's slot stays as it is).
  Slot s{};
  Status st = UpdateElem(slots_.get(), &id, &s, BPF_NOEXIST, "egress slots");
  return st.code() == StatusCode::kAlreadyExists ? OkStatus() : st;
}

Status EgressGuard::Set(int cgroup_fd, uint32_t addr, const NetworkPolicy& p) {
  DSEC_ASSIGN_OR_RETURN(uint64_t id, CgroupId(cgroup_fd));
  Entry next;
  if (p.mode != NetMode::kNone) next.addr = addr;
  // Only rules that reach into a private range matter here (nothing else asks the sandbox's
  // entries), each network once.
  if (next.addr)
    for (const Rule& r : p.rules) {
      Ipv4Net n{r.addr, r.prefix};
      bool priv = std::any_of(std::begin(kPrivateNets), std::end(kPrivateNets), [&](Ipv4Net q) {
        uint8_t shorter = std::min(n.prefix, q.prefix);
        return (n.base & PrefixMask(shorter)) == (q.base & PrefixMask(shorter));
      });
      if (priv && std::find(next.allowed.begin(), next.allowed.end(), n) == next.allowed.end())
        next.allowed.push_back(n);
    }
  Slot s{};
  if (!bpf::LookupElem(slots_.get(), &id, &s).value_or(false))
    return NotFound("the egress guard is not attached to this cgroup");
  MutexLock l(mu_);
  Entry& cur = entries_[id];
  // The new networks first, then the old ones go: a change never refuses what both allow.
  for (const Ipv4Net& n : next.allowed) {
    TrieKey k{32u + n.prefix, htonl(next.addr), htonl(n.base)};
    DSEC_RETURN_IF_ERROR(UpdateElem(trie_.get(), &k, &kAllowed, BPF_ANY, "egress trie"));
  }
  s.mode = p.mode == NetMode::kNone ? kNoNetwork : kNetworked;
  s.addr = htonl(next.addr);
  // Only mode and address are ours: the counters are the programs' (a race with a refusal
  // loses at most its count or log slot).
  DSEC_RETURN_IF_ERROR(UpdateElem(slots_.get(), &id, &s, BPF_EXIST, "egress slots"));
  for (const Ipv4Net& n : cur.allowed) {
    if (cur.addr == next.addr &&
        std::find(next.allowed.begin(), next.allowed.end(), n) != next.allowed.end())
      continue;
    TrieKey k{32u + n.prefix, htonl(cur.addr), htonl(n.base)};
    (void)DeleteElem(trie_.get(), &k);
  }
  cur = std::move(next);
  return OkStatus();
}

void EgressGuard::Forget(int cgroup_fd) {
  auto id = CgroupId(cgroup_fd);
  if (!id.ok()) return;
  (void)DeleteElem(slots_.get(), &*id);
  MutexLock l(mu_);
  auto it = entries_.find(*id);
  if (it == entries_.end()) return;
  for (const Ipv4Net& n : it->second.allowed) {
    TrieKey k{32u + n.prefix, htonl(it->second.addr), htonl(n.base)};
    (void)DeleteElem(trie_.get(), &k);
  }
  entries_.erase(it);
}

uint64_t EgressGuard::Denied(int cgroup_fd) {
  auto id = CgroupId(cgroup_fd);
  Slot s{};
  if (!id.ok() || !bpf::LookupElem(slots_.get(), &*id, &s).value_or(false)) return 0;
  return s.denied;
}

uint64_t EgressGuard::DeniedTotal() {
  uint32_t k = 0;
  NodeEntry e{};
  return bpf::LookupElem(node_.get(), &k, &e).value_or(false) ? e.total : 0;
}

void EgressGuard::Loop() {
  auto* consumer = static_cast<std::atomic<uint64_t>*>(consumer_);
  auto* producer = static_cast<std::atomic<uint64_t>*>(producer_);
  const char* data = static_cast<const char*>(producer_) + page_;
  while (!stop_) {
    pollfd pfd{events_.get(), POLLIN, 0};
    (void)poll(&pfd, 1, 200);
    uint64_t cons = consumer->load(std::memory_order_acquire);
    uint64_t prod = producer->load(std::memory_order_acquire);
    while (cons < prod) {
      const char* rec = data + (cons & (ring_size_ - 1));
      uint32_t len =
          reinterpret_cast<const std::atomic<uint32_t>*>(rec)->load(std::memory_order_acquire);
      if (len & BPF_RINGBUF_BUSY_BIT) break;
      uint32_t size = len & ~(BPF_RINGBUF_BUSY_BIT | BPF_RINGBUF_DISCARD_BIT);
      if (!(len & BPF_RINGBUF_DISCARD_BIT) && size >= sizeof(Event) && opts_.on_denied) {
        Event e;
        memcpy(&e, rec + BPF_RINGBUF_HDR_SZ, sizeof e);
        DeniedPacket d;
        d.src = ntohl(e.src);
        d.dst = e.family == 6 ? 0 : ntohl(e.dst);
        d.ipv6 = e.family == 6;
        d.proto = static_cast<uint8_t>(e.proto);
        d.dport = ntohs(static_cast<uint16_t>(e.port));
        d.at_connect = true;
        opts_.on_denied(d);
      }
      cons += (size + BPF_RINGBUF_HDR_SZ + 7) & ~uint64_t{7};
      consumer->store(cons, std::memory_order_release);
    }
  }
}

}  // namespace dsec::net
