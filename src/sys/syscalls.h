// Thin wrappers for syscalls glibc 2.36 lacks or declares in conflicting headers: clone3,
// pidfd, the new mount API, openat2. Each returns -1 and sets errno on failure, like libc.
// Kept header-light so both the edge and the static agent use them.
#pragma once

#include <fcntl.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <linux/sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>

namespace dsec::sys {

inline long Clone3(clone_args* args) { return syscall(SYS_clone3, args, sizeof(clone_args)); }
inline int PidfdOpen(pid_t pid, unsigned flags) {
  return static_cast<int>(syscall(SYS_pidfd_open, pid, flags));
}
inline int PidfdSendSignal(int pidfd, int sig) {
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}
inline int OpenTree(int dfd, const char* path, unsigned flags) {
  return static_cast<int>(syscall(SYS_open_tree, dfd, path, flags));
}
inline int MoveMount(int from_dfd, const char* from_path, int to_dfd, const char* to_path,
                     unsigned flags) {
  return static_cast<int>(syscall(SYS_move_mount, from_dfd, from_path, to_dfd, to_path, flags));
}
inline int MountSetattr(int dfd, const char* path, unsigned flags, mount_attr* attr) {
  return static_cast<int>(syscall(SYS_mount_setattr, dfd, path, flags, attr, sizeof(*attr)));
}
inline int FsOpen(const char* fsname, unsigned flags) {
  return static_cast<int>(syscall(SYS_fsopen, fsname, flags));
}
inline int FsConfig(int fd, unsigned cmd, const char* key, const void* value, int aux) {
  return static_cast<int>(syscall(SYS_fsconfig, fd, cmd, key, value, aux));
}
inline int FsMount(int fd, unsigned flags, unsigned attr_flags) {
  return static_cast<int>(syscall(SYS_fsmount, fd, flags, attr_flags));
}
inline int Openat2(int dirfd, const char* path, int flags, mode_t mode, uint64_t resolve) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags);
  how.mode = (flags & (O_CREAT | O_TMPFILE)) ? mode : 0;
  how.resolve = resolve;
  return static_cast<int>(syscall(SYS_openat2, dirfd, path, &how, sizeof how));
}
inline int PivotRoot(const char* new_root, const char* put_old) {
  return static_cast<int>(syscall(SYS_pivot_root, new_root, put_old));
}
inline int CloseRange(unsigned first, unsigned last, unsigned flags) {
  return static_cast<int>(syscall(SYS_close_range, first, last, flags));
}
inline int Execveat(int dirfd, const char* path, char* const argv[], char* const envp[],
                    int flags) {
  return static_cast<int>(syscall(SYS_execveat, dirfd, path, argv, envp, flags));
}

}  // namespace dsec::sys
