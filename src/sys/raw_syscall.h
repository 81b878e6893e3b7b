// Syscalls that do not touch errno or any other memory: for code that runs in a child
// sharing the parent's address space (CLONE_VM) before exec. Returns -errno on failure.
#pragma once

#include <linux/sched.h>
#include <sys/syscall.h>

#include <cstddef>

#if !defined(__x86_64__)
#error "raw_syscall.h: only x86-64 is implemented"
#endif

namespace dsec::sys {

inline long RawSyscall(long n, long a1 = 0, long a2 = 0, long a3 = 0, long a4 = 0, long a5 = 0,
                       long a6 = 0) {
  long ret;
  register long r10 asm("r10") = a4;
  register long r8 asm("r8") = a5;
  register long r9 asm("r9") = a6;
  asm volatile("syscall"
               : "=a"(ret)
               : "a"(n), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
               : "rcx", "r11", "memory");
  return ret;
}

// clone3 whose child runs fn(arg) on args->stack and then exits with its result. In the
// parent it returns the child's pid or -errno. Meant for CLONE_VM children.
extern "C" long dsec_clone3_run(clone_args* args, size_t size, int (*fn)(void*), void* arg);

}  // namespace dsec::sys
