#include "sys/bpf.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace dsec::bpf {

long Sys(int cmd, bpf_attr* attr) { return syscall(__NR_bpf, cmd, attr, sizeof(*attr)); }

bpf_insn Insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
  bpf_insn i{};
  i.code = code;
  i.dst_reg = dst & 0xf;
  i.src_reg = src & 0xf;
  i.off = off;
  i.imm = imm;
  return i;
}

Program& Program::LoadMap(uint8_t dst, int map_fd) {
  insns_.push_back(Insn(BPF_LD | BPF_DW | BPF_IMM, dst, BPF_PSEUDO_MAP_FD, 0, map_fd));
  insns_.push_back(Insn(0, 0, 0, 0, 0));
  return *this;
}

Program& Program::JumpImm(uint8_t op, uint8_t dst, int32_t imm, int label) {
  pending_.emplace_back(insns_.size(), label);
  insns_.push_back(JmpImm(op, dst, imm, 0));
  return *this;
}

Program& Program::JumpReg(uint8_t op, uint8_t dst, uint8_t src, int label) {
  pending_.emplace_back(insns_.size(), label);
  insns_.push_back(JmpReg(op, dst, src, 0));
  return *this;
}

Program& Program::JumpImm32(uint8_t op, uint8_t dst, int32_t imm, int label) {
  pending_.emplace_back(insns_.size(), label);
  insns_.push_back(Insn(BPF_JMP32 | op | BPF_K, dst, 0, 0, imm));
  return *this;
}

Program& Program::LoadImm64(uint8_t dst, uint64_t value) {
  insns_.push_back(Insn(BPF_LD | BPF_DW | BPF_IMM, dst, 0, 0, static_cast<int32_t>(value)));
  insns_.push_back(Insn(0, 0, 0, 0, static_cast<int32_t>(value >> 32)));
  return *this;
}

Program& Program::Goto(int label) {
  pending_.emplace_back(insns_.size(), label);
  insns_.push_back(Insn(BPF_JMP | BPF_JA, 0, 0, 0, 0));
  return *this;
}

Program& Program::Place(int label) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second == label) {
      insns_[it->first].off = static_cast<int16_t>(insns_.size() - it->first - 1);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  return *this;
}

StatusOr<UniqueFd> CreateMap(bpf_map_type type, uint32_t key, uint32_t value, uint32_t entries,
                             uint32_t flags, const char* what) {
  bpf_attr a{};
  a.map_type = type;
  a.key_size = key;
  a.value_size = value;
  a.max_entries = entries;
  a.map_flags = flags;
  long fd = Sys(BPF_MAP_CREATE, &a);
  if (fd < 0) return ErrnoError(std::string("bpf(BPF_MAP_CREATE ") + what + ")");
  return UniqueFd(static_cast<int>(fd));
}

StatusOr<UniqueFd> LoadProgram(bpf_prog_type type, const std::vector<bpf_insn>& insns,
                               bpf_attach_type attach, const char* what) {
  static constexpr char kLicense[] = "Dual BSD/GPL";
  std::vector<char> log(16384);
  bpf_attr a{};
  a.prog_type = type;
  a.expected_attach_type = attach;
  a.insns = reinterpret_cast<uint64_t>(insns.data());
  a.insn_cnt = static_cast<uint32_t>(insns.size());
  a.license = reinterpret_cast<uint64_t>(kLicense);
  a.log_buf = reinterpret_cast<uint64_t>(log.data());
  a.log_size = static_cast<uint32_t>(log.size());
  a.log_level = 1;
  long fd = Sys(BPF_PROG_LOAD, &a);
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

namespace {

// BPF_PROG_ATTACH and friends want a directory descriptor that is not O_PATH.
StatusOr<UniqueFd> OpenDir(int cgroup_fd) {
  UniqueFd dir(openat(cgroup_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return ErrnoError("open cgroup dir for BPF");
  return dir;
}

}  // namespace

Status AttachToCgroup(int cgroup_fd, int prog, bpf_attach_type type, const char* what) {
  DSEC_ASSIGN_OR_RETURN(UniqueFd dir, OpenDir(cgroup_fd));
  bpf_attr a{};
  a.target_fd = static_cast<uint32_t>(dir.get());
  a.attach_bpf_fd = static_cast<uint32_t>(prog);
  a.attach_type = type;
  a.attach_flags = BPF_F_ALLOW_MULTI;
  if (Sys(BPF_PROG_ATTACH, &a) < 0)
    return ErrnoError(std::string("bpf(BPF_PROG_ATTACH ") + what + ")");
  return OkStatus();
}

StatusOr<std::vector<uint32_t>> AttachedPrograms(int cgroup_fd, bpf_attach_type type) {
  DSEC_ASSIGN_OR_RETURN(UniqueFd dir, OpenDir(cgroup_fd));
  std::vector<uint32_t> ids(64);
  bpf_attr a{};
  a.query.target_fd = static_cast<uint32_t>(dir.get());
  a.query.attach_type = type;
  a.query.prog_ids = reinterpret_cast<uint64_t>(ids.data());
  a.query.prog_cnt = static_cast<uint32_t>(ids.size());
  if (Sys(BPF_PROG_QUERY, &a) < 0) return ErrnoError("bpf(BPF_PROG_QUERY)");
  ids.resize(a.query.prog_cnt);
  return ids;
}

StatusOr<uint32_t> ProgramId(int prog) {
  bpf_prog_info info{};
  bpf_attr a{};
  a.info.bpf_fd = static_cast<uint32_t>(prog);
  a.info.info_len = sizeof(info);
  a.info.info = reinterpret_cast<uint64_t>(&info);
  if (Sys(BPF_OBJ_GET_INFO_BY_FD, &a) < 0) return ErrnoError("bpf(BPF_OBJ_GET_INFO_BY_FD)");
  return info.id;
}

Status DetachFromCgroup(int cgroup_fd, uint32_t id, bpf_attach_type type) {
  bpf_attr g{};
  g.prog_id = id;
  long prog = Sys(BPF_PROG_GET_FD_BY_ID, &g);
  if (prog < 0) {
    if (errno == ENOENT) return OkStatus();  // gone meanwhile
    return ErrnoError("bpf(BPF_PROG_GET_FD_BY_ID)");
  }
  UniqueFd p(static_cast<int>(prog));
  DSEC_ASSIGN_OR_RETURN(UniqueFd dir, OpenDir(cgroup_fd));
  bpf_attr a{};
  a.target_fd = static_cast<uint32_t>(dir.get());
  a.attach_bpf_fd = static_cast<uint32_t>(p.get());
  a.attach_type = type;
  if (Sys(BPF_PROG_DETACH, &a) < 0 && errno != ENOENT) return ErrnoError("bpf(BPF_PROG_DETACH)");
  return OkStatus();
}

StatusOr<uint64_t> CgroupId(int cgroup_fd) {
  struct stat st;
  if (fstat(cgroup_fd, &st) < 0) return ErrnoError("fstat cgroup");
  return static_cast<uint64_t>(st.st_ino);  // cgroup2: the cgroup id is its inode number
}

Status UpdateElem(int map, const void* key, const void* value, uint64_t flags, const char* what) {
  bpf_attr a{};
  a.map_fd = static_cast<uint32_t>(map);
  a.key = reinterpret_cast<uint64_t>(key);
  a.value = reinterpret_cast<uint64_t>(value);
  a.flags = flags;
  if (Sys(BPF_MAP_UPDATE_ELEM, &a) < 0)
    return ErrnoError(std::string("bpf(BPF_MAP_UPDATE_ELEM ") + what + ")");
  return OkStatus();
}

StatusOr<bool> LookupElem(int map, const void* key, void* value) {
  bpf_attr a{};
  a.map_fd = static_cast<uint32_t>(map);
  a.key = reinterpret_cast<uint64_t>(key);
  a.value = reinterpret_cast<uint64_t>(value);
  if (Sys(BPF_MAP_LOOKUP_ELEM, &a) < 0) {
    if (errno == ENOENT) return false;
    return ErrnoError("bpf(BPF_MAP_LOOKUP_ELEM)");
  }
  return true;
}

Status DeleteElem(int map, const void* key) {
  bpf_attr a{};
  a.map_fd = static_cast<uint32_t>(map);
  a.key = reinterpret_cast<uint64_t>(key);
  if (Sys(BPF_MAP_DELETE_ELEM, &a) < 0 && errno != ENOENT)
    return ErrnoError("bpf(BPF_MAP_DELETE_ELEM)");
  return OkStatus();
}

}  // namespace dsec::bpf
