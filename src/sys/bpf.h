// Raw bpf(2) for the edge's cgroup programs (no libbpf, no clang): instruction builders for
// hand-assembled programs, map and program creation, attaching to a cgroup2 directory and
// map access. The kernel's BPF_* instruction macros are not exported to user space, so the
// builders here stand in for them. Used by isolation/socket_budget and net/egress_guard.
// Privileges: CAP_BPF + CAP_NET_ADMIN + CAP_SYS_ADMIN (root); unprivileged BPF is off.
#pragma once

#include <linux/bpf.h>

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace dsec::bpf {

inline constexpr uint8_t R0 = 0, R1 = 1, R2 = 2, R3 = 3, R4 = 4, R5 = 5, R6 = 6, R7 = 7, R8 = 8,
                         R9 = 9, R10 = 10;

long Sys(int cmd, bpf_attr* attr);

bpf_insn Insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm);
inline bpf_insn MovReg(uint8_t dst, uint8_t src) {
  return Insn(BPF_ALU64 | BPF_MOV | BPF_X, dst, src, 0, 0);
}
inline bpf_insn MovImm(uint8_t dst, int32_t imm) {
  return Insn(BPF_ALU64 | BPF_MOV | BPF_K, dst, 0, 0, imm);
}
inline bpf_insn AddImm(uint8_t dst, int32_t imm) {
  return Insn(BPF_ALU64 | BPF_ADD | BPF_K, dst, 0, 0, imm);
}
inline bpf_insn AndImm(uint8_t dst, int32_t imm) {
  return Insn(BPF_ALU64 | BPF_AND | BPF_K, dst, 0, 0, imm);
}
inline bpf_insn OrReg(uint8_t dst, uint8_t src) {
  return Insn(BPF_ALU64 | BPF_OR | BPF_X, dst, src, 0, 0);
}
inline bpf_insn SubReg(uint8_t dst, uint8_t src) {
  return Insn(BPF_ALU64 | BPF_SUB | BPF_X, dst, src, 0, 0);
}
// Loads and stores of `size` BPF_B / BPF_H / BPF_W / BPF_DW.
inline bpf_insn Load(uint8_t size, uint8_t dst, uint8_t src, int16_t off) {
  return Insn(BPF_LDX | BPF_MEM | size, dst, src, off, 0);
}
inline bpf_insn Store(uint8_t size, uint8_t dst, uint8_t src, int16_t off) {
  return Insn(BPF_STX | BPF_MEM | size, dst, src, off, 0);
}
inline bpf_insn StoreImm(uint8_t size, uint8_t dst, int16_t off, int32_t imm) {
  return Insn(BPF_ST | BPF_MEM | size, dst, 0, off, imm);
}
inline bpf_insn AtomicAddDw(uint8_t dst, uint8_t src, int16_t off) {
  return Insn(BPF_STX | BPF_DW | BPF_ATOMIC, dst, src, off, BPF_ADD);
}
// Conditional jumps (`op`: BPF_JEQ, BPF_JNE, BPF_JGE, ...) by `off` instructions; the
// Label/Jump helpers of Program patch them.
inline bpf_insn JmpImm(uint8_t op, uint8_t dst, int32_t imm, int16_t off) {
  return Insn(BPF_JMP | op | BPF_K, dst, 0, off, imm);
}
inline bpf_insn JmpReg(uint8_t op, uint8_t dst, uint8_t src, int16_t off) {
  return Insn(BPF_JMP | op | BPF_X, dst, src, off, 0);
}
inline bpf_insn Call(int32_t fn) { return Insn(BPF_JMP | BPF_CALL, 0, 0, 0, fn); }
inline bpf_insn Exit() { return Insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0); }

// A program being assembled, with forward jumps to named places.
class Program {
 public:
  Program& operator<<(const bpf_insn& i) {
    insns_.push_back(i);
    return *this;
  }
  // ld_imm64 of a map's descriptor: two instructions.
  Program& LoadMap(uint8_t dst, int map_fd);
  // A jump (JmpImm/JmpReg, or BPF_JA with `op` 0xff) to `label`, placed when Place(label)
  // is called.
  Program& JumpImm(uint8_t op, uint8_t dst, int32_t imm, int label);
  Program& JumpReg(uint8_t op, uint8_t dst, uint8_t src, int label);
  // The same on the low 32 bits of `dst` (BPF_JMP32), for u32 context fields and map values.
  Program& JumpImm32(uint8_t op, uint8_t dst, int32_t imm, int label);
  Program& Goto(int label);
  // ld_imm64 of a constant: two instructions.
  Program& LoadImm64(uint8_t dst, uint64_t value);
  Program& Place(int label);
  // The instructions; every jump's label must have been placed (after it).
  const std::vector<bpf_insn>& insns() const { return insns_; }

 private:
  std::vector<bpf_insn> insns_;
  std::vector<std::pair<size_t, int>> pending_;  // (jump index, label)
};

StatusOr<UniqueFd> CreateMap(bpf_map_type type, uint32_t key, uint32_t value, uint32_t entries,
                             uint32_t flags, const char* what);
// Loads a program of `type` for `attach`; the verifier's last words are in the error.
StatusOr<UniqueFd> LoadProgram(bpf_prog_type type, const std::vector<bpf_insn>& insns,
                               bpf_attach_type attach, const char* what);
// Attaches `prog` to the cgroup2 directory `cgroup_fd` (an O_PATH descriptor will do) with
// BPF_F_ALLOW_MULTI.
Status AttachToCgroup(int cgroup_fd, int prog, bpf_attach_type type, const char* what);
// The ids of the programs attached to the cgroup at `type` (directly, not inherited).
StatusOr<std::vector<uint32_t>> AttachedPrograms(int cgroup_fd, bpf_attach_type type);
// The id of a loaded program.
StatusOr<uint32_t> ProgramId(int prog);
// Detaches the program with id `id` from the cgroup at `type`.
Status DetachFromCgroup(int cgroup_fd, uint32_t id, bpf_attach_type type);
// A cgroup2 directory's id (its inode number).
StatusOr<uint64_t> CgroupId(int cgroup_fd);

Status UpdateElem(int map, const void* key, const void* value, uint64_t flags, const char* what);
// False if there is no such element (ENOENT); other errors are errors.
StatusOr<bool> LookupElem(int map, const void* key, void* value);
// OK also if there was none.
Status DeleteElem(int map, const void* key);

}  // namespace dsec::bpf
