#include "isolation/socket_budget.h"

#include <fcntl.h>
#include <linux/bpf.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace dsec::isolation {

namespace {

long Bpf(int cmd, bpf_attr* attr) { return syscall(__NR_bpf, cmd, attr, sizeof(*attr)); }

// Instruction builders (the kernel's BPF_* insn macros are not exported to user space).
bpf_insn Insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
  bpf_insn i{};
  i.code = code;
  i.dst_reg = dst & 0xf;
  i.src_reg = src & 0xf;
  i.off = off;
  i.imm = imm;
  return i;
}
bpf_insn MovReg(uint8_t dst, uint8_t src) {
  return Insn(BPF_ALU64 | BPF_MOV | BPF_X, dst, src, 0, 0);
}
bpf_insn MovImm(uint8_t dst, int32_t imm) {
  return Insn(BPF_ALU64 | BPF_MOV | BPF_K, dst, 0, 0, imm);
}
bpf_insn AddImm(uint8_t dst, int32_t imm) {
  return Insn(BPF_ALU64 | BPF_ADD | BPF_K, dst, 0, 0, imm);
}
bpf_insn LoadDw(uint8_t dst, uint8_t src, int16_t off) {
  return Insn(BPF_LDX | BPF_MEM | BPF_DW, dst, src, off, 0);
}
bpf_insn StoreDw(uint8_t dst, uint8_t src, int16_t off) {
  return Insn(BPF_STX | BPF_MEM | BPF_DW, dst, src, off, 0);
}
bpf_insn StoreImmDw(uint8_t dst, int16_t off, int32_t imm) {
  return Insn(BPF_ST | BPF_MEM | BPF_DW, dst, 0, off, imm);
}
bpf_insn AtomicAddDw(uint8_t dst, uint8_t src, int16_t off) {
  return Insn(BPF_STX | BPF_DW | BPF_ATOMIC, dst, src, off, BPF_ADD);
}
bpf_insn JgeReg(uint8_t dst, uint8_t src, int16_t off) {
  return Insn(BPF_JMP | BPF_JGE | BPF_X, dst, src, off, 0);
}
bpf_insn JneImm(uint8_t dst, int32_t imm, int16_t off) {
  return Insn(BPF_JMP | BPF_JNE | BPF_K, dst, 0, off, imm);
}
bpf_insn Call(int32_t fn) { return Insn(BPF_JMP | BPF_CALL, 0, 0, 0, fn); }
bpf_insn Exit() { return Insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0); }
// ld_imm64 of a map: two instructions.
void LoadMap(std::vector<bpf_insn>* p, uint8_t dst, int map_fd) {
  p->push_back(Insn(BPF_LD | BPF_DW | BPF_IMM, dst, BPF_PSEUDO_MAP_FD, 0, map_fd));
  p->push_back(Insn(0, 0, 0, 0, 0));
}

constexpr uint8_t R0 = 0, R1 = 1, R2 = 2, R3 = 3, R4 = 4, R6 = 6, R7 = 7, R10 = 10;

// The cgroup storage value: {count, limit}.
struct Budget {
  uint64_t count;
  uint64_t limit;
};

// sock_create: allow (1) and count, or refuse (0) once count >= limit.
std::vector<bpf_insn> CreateProgram(int storage, int tracked) {
  std::vector<bpf_insn> p;
  p.push_back(MovReg(R6, R1));
  p.push_back(Call(BPF_FUNC_get_socket_cookie));  // r1 = ctx
  p.push_back(StoreDw(R10, R0, -8));              // key: the cookie
  p.push_back(StoreImmDw(R10, -16, 1));           // value
  LoadMap(&p, R1, storage);
  p.push_back(MovImm(R2, 0));
  p.push_back(Call(BPF_FUNC_get_local_storage));
  p.push_back(MovReg(R7, R0));
  p.push_back(LoadDw(R1, R7, 0));  // count
  p.push_back(LoadDw(R2, R7, 8));  // limit
  size_t deny_jump = p.size();
  p.push_back(JgeReg(R1, R2, 0));  // patched below
  LoadMap(&p, R1, tracked);
  p.push_back(MovReg(R2, R10));
  p.push_back(AddImm(R2, -8));
  p.push_back(MovReg(R3, R10));
  p.push_back(AddImm(R3, -16));
  p.push_back(MovImm(R4, BPF_ANY));
  p.push_back(Call(BPF_FUNC_map_update_elem));
  size_t full_jump = p.size();
  p.push_back(JneImm(R0, 0, 0));  // the node-wide table is full: refuse
  p.push_back(MovImm(R1, 1));
  p.push_back(AtomicAddDw(R7, R1, 0));
  p.push_back(MovImm(R0, 1));
  p.push_back(Exit());
  size_t deny = p.size();
  p.push_back(MovImm(R0, 0));
  p.push_back(Exit());
  p[deny_jump].off = static_cast<int16_t>(deny - deny_jump - 1);
  p[full_jump].off = static_cast<int16_t>(deny - full_jump - 1);
  return p;
}

// sock_release: uncount a socket the create program counted.
std::vector<bpf_insn> ReleaseProgram(int storage, int tracked) {
  std::vector<bpf_insn> p;
  p.push_back(Call(BPF_FUNC_get_socket_cookie));  // r1 = ctx
  p.push_back(StoreDw(R10, R0, -8));
  LoadMap(&p, R1, tracked);
  p.push_back(MovReg(R2, R10));
  p.push_back(AddImm(R2, -8));
  p.push_back(Call(BPF_FUNC_map_delete_elem));
  size_t skip = p.size();
  p.push_back(JneImm(R0, 0, 0));  // not ours to uncount
  LoadMap(&p, R1, storage);
  p.push_back(MovImm(R2, 0));
  p.push_back(Call(BPF_FUNC_get_local_storage));
  p.push_back(MovImm(R1, -1));
  p.push_back(AtomicAddDw(R0, R1, 0));
  size_t out = p.size();
  p.push_back(MovImm(R0, 1));
  p.push_back(Exit());
  p[skip].off = static_cast<int16_t>(out - skip - 1);
  return p;
}

StatusOr<UniqueFd> CreateMap(bpf_map_type type, uint32_t key, uint32_t value, uint32_t entries,
                             uint32_t flags, const char* what) {
  bpf_attr a{};
  a.map_type = type;
  a.key_size = key;
  a.value_size = value;
  a.max_entries = entries;
  a.map_flags = flags;
  long fd = Bpf(BPF_MAP_CREATE, &a);
  if (fd < 0) return ErrnoError(std::string("bpf(BPF_MAP_CREATE ") + what + ")");
  return UniqueFd(static_cast<int>(fd));
}

StatusOr<UniqueFd> LoadProgram(const std::vector<bpf_insn>& insns, bpf_attach_type attach,
                               const char* what) {
  static constexpr char kLicense[] = "Dual BSD/GPL";
  std::vector<char> log(16384);
  bpf_attr a{};
  a.prog_type = BPF_PROG_TYPE_CGROUP_SOCK;
  a.expected_attach_type = attach;
  a.insns = reinterpret_cast<uint64_t>(insns.data());
  a.insn_cnt = static_cast<uint32_t>(insns.size());
  a.license = reinterpret_cast<uint64_t>(kLicense);
  a.log_buf = reinterpret_cast<uint64_t>(log.data());
  a.log_size = static_cast<uint32_t>(log.size());
  a.log_level = 1;
  long fd = Bpf(BPF_PROG_LOAD, &a);
  if (fd < 0) {
    int err = errno;
    std::string msg(log.data(), strnlen(log.data(), log.size()));
    if (msg.size() > 400) msg = "..." + msg.substr(msg.size() - 400);
    for (char& c : msg)
      if (c == '\n') c = ' ';
    return ErrnoStatus(err, std::string("bpf(BPF_PROG_LOAD ") + what + "): " + msg);
  }
  return UniqueFd(static_cast<int>(fd));
}

StatusOr<uint64_t> CgroupId(int cgroup_fd) {
  struct stat st;
  if (fstat(cgroup_fd, &st) < 0) return ErrnoError("fstat cgroup");
  return static_cast<uint64_t>(st.st_ino);  // cgroup2: the cgroup id is its inode number
}

}  // namespace

StatusOr<std::unique_ptr<SocketBudget>> SocketBudget::Create(uint32_t max_tracked) {
  std::unique_ptr<SocketBudget> b(new SocketBudget());
  // Keyed by cgroup id (a u64 key), so the create and release programs share one value.
  DSEC_ASSIGN_OR_RETURN(b->storage_, CreateMap(BPF_MAP_TYPE_CGROUP_STORAGE, sizeof(uint64_t),
                                               sizeof(Budget), 0, 0, "cgroup storage"));
  DSEC_ASSIGN_OR_RETURN(
      b->tracked_, CreateMap(BPF_MAP_TYPE_HASH, sizeof(uint64_t), sizeof(uint64_t), max_tracked,
                             BPF_F_NO_PREALLOC, "socket table"));
  DSEC_ASSIGN_OR_RETURN(b->create_prog_,
                        LoadProgram(CreateProgram(b->storage_.get(), b->tracked_.get()),
                                    BPF_CGROUP_INET_SOCK_CREATE, "sock_create"));
  DSEC_ASSIGN_OR_RETURN(b->release_prog_,
                        LoadProgram(ReleaseProgram(b->storage_.get(), b->tracked_.get()),
                                    BPF_CGROUP_INET_SOCK_RELEASE, "sock_release"));
  return b;
}

Status SocketBudget::Attach(int cgroup_fd, uint64_t limit) const {
  // BPF_PROG_ATTACH wants a directory fd that is not O_PATH.
  UniqueFd dir(openat(cgroup_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return ErrnoError("open cgroup dir for BPF");
  for (auto [prog, type, what] :
       {std::tuple{create_prog_.get(), BPF_CGROUP_INET_SOCK_CREATE, "sock_create"},
        std::tuple{release_prog_.get(), BPF_CGROUP_INET_SOCK_RELEASE, "sock_release"}}) {
    bpf_attr a{};
    a.target_fd = static_cast<uint32_t>(dir.get());
    a.attach_bpf_fd = static_cast<uint32_t>(prog);
    a.attach_type = type;
    a.attach_flags = BPF_F_ALLOW_MULTI;
    if (Bpf(BPF_PROG_ATTACH, &a) < 0)
      return ErrnoError(std::string("bpf(BPF_PROG_ATTACH ") + what + ")");
  }
  DSEC_ASSIGN_OR_RETURN(uint64_t id, CgroupId(dir.get()));
  Budget v{0, limit};
  bpf_attr a{};
  a.map_fd = static_cast<uint32_t>(storage_.get());
  a.key = reinterpret_cast<uint64_t>(&id);
  a.value = reinterpret_cast<uint64_t>(&v);
  a.flags = BPF_ANY;
  if (Bpf(BPF_MAP_UPDATE_ELEM, &a) < 0) return ErrnoError("bpf(BPF_MAP_UPDATE_ELEM socket limit)");
  return OkStatus();
}

}  // namespace dsec::isolation
