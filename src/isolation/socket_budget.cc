#include "isolation/socket_budget.h"

#include <vector>

#include "sys/bpf.h"

namespace dsec::isolation {

namespace {

using namespace dsec::bpf;  // NOLINT(google-build-using-namespace): the assembler

// The cgroup storage value: {count, limit}.
struct Budget {
  uint64_t count;
  uint64_t limit;
};

// sock_create: allow (1) and count, or refuse (0) once count >= limit.
std::vector<bpf_insn> CreateProgram(int storage, int tracked) {
  enum { kDeny };
  Program p;
  p << MovReg(R6, R1) << Call(BPF_FUNC_get_socket_cookie)  // r1 = ctx
    << Store(BPF_DW, R10, R0, -8)                          // key: the cookie
    << StoreImm(BPF_DW, R10, -16, 1);                      // value
  p.LoadMap(R1, storage);
  p << MovImm(R2, 0) << Call(BPF_FUNC_get_local_storage) << MovReg(R7, R0)
    << Load(BPF_DW, R1, R7, 0)   // count
    << Load(BPF_DW, R2, R7, 8);  // limit
  p.JumpReg(BPF_JGE, R1, R2, kDeny).LoadMap(R1, tracked);
  p << MovReg(R2, R10) << AddImm(R2, -8) << MovReg(R3, R10) << AddImm(R3, -16)
    << MovImm(R4, BPF_ANY) << Call(BPF_FUNC_map_update_elem);
  p.JumpImm(BPF_JNE, R0, 0, kDeny);  // the node-wide table is full: refuse
  p << MovImm(R1, 1) << AtomicAddDw(R7, R1, 0) << MovImm(R0, 1) << Exit();
  p.Place(kDeny) << MovImm(R0, 0) << Exit();
  return p.insns();
}

// sock_release: uncount a socket the create program counted.
std::vector<bpf_insn> ReleaseProgram(int storage, int tracked) {
  enum { kOut };
  Program p;
  p << Call(BPF_FUNC_get_socket_cookie)  // r1 = ctx
    << Store(BPF_DW, R10, R0, -8);
  p.LoadMap(R1, tracked);
  p << MovReg(R2, R10) << AddImm(R2, -8) << Call(BPF_FUNC_map_delete_elem);
  p.JumpImm(BPF_JNE, R0, 0, kOut).LoadMap(R1, storage);  // not ours to uncount
  p << MovImm(R2, 0) << Call(BPF_FUNC_get_local_storage) << MovImm(R1, -1)
    << AtomicAddDw(R0, R1, 0);
  p.Place(kOut) << MovImm(R0, 1) << Exit();
  return p.insns();
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
  DSEC_ASSIGN_OR_RETURN(
      b->create_prog_,
      LoadProgram(BPF_PROG_TYPE_CGROUP_SOCK, CreateProgram(b->storage_.get(), b->tracked_.get()),
                  BPF_CGROUP_INET_SOCK_CREATE, "sock_create"));
  DSEC_ASSIGN_OR_RETURN(
      b->release_prog_,
      LoadProgram(BPF_PROG_TYPE_CGROUP_SOCK, ReleaseProgram(b->storage_.get(), b->tracked_.get()),
                  BPF_CGROUP_INET_SOCK_RELEASE, "sock_release"));
  return b;
}

Status SocketBudget::Attach(int cgroup_fd, uint64_t limit) const {
  DSEC_RETURN_IF_ERROR(
      AttachToCgroup(cgroup_fd, create_prog_.get(), BPF_CGROUP_INET_SOCK_CREATE, "sock_create"));
  DSEC_RETURN_IF_ERROR(
      AttachToCgroup(cgroup_fd, release_prog_.get(), BPF_CGROUP_INET_SOCK_RELEASE, "sock_release"));
  DSEC_ASSIGN_OR_RETURN(uint64_t id, CgroupId(cgroup_fd));
  Budget v{0, limit};
  return UpdateElem(storage_.get(), &id, &v, BPF_ANY, "socket limit");
}

}  // namespace dsec::isolation
