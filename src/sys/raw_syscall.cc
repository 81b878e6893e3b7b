#include "sys/raw_syscall.h"

// The child comes back from the syscall on its new stack with no frame to return to, so this
// has to be assembly: fn and arg live in callee-saved registers across the syscall.
asm(R"(
    .text
    .globl dsec_clone3_run
    .type dsec_clone3_run,@function
dsec_clone3_run:
    push %r12
    push %r13
    mov %rdx, %r12
    mov %rcx, %r13
    mov $435, %eax
    syscall
    test %rax, %rax
    jz 1f
    pop %r13
    pop %r12
    ret
1:
    xor %ebp, %ebp
    mov %r13, %rdi
    call *%r12
    mov %eax, %edi
    mov $231, %eax
    syscall
    hlt
    .size dsec_clone3_run, .-dsec_clone3_run
    .section .note.GNU-stack,"",@progbits
    .text
)");

static_assert(SYS_clone3 == 435 && SYS_exit_group == 231, "x86-64 syscall numbers");
