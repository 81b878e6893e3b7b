// /init of the qemu-microvm peer's initramfs: prints a marker on the console and powers the
// VM off, so one QEMU run is "boot to init and back". Built static (no libc in the initramfs).
#include <stdio.h>
#include <sys/reboot.h>
#include <unistd.h>

int main(void) {
  static const char kMarker[] = "DSEC-MICROVM-INIT-OK\n";
  // The kernel opens /dev/console for init when the initramfs has it; write to fd 1 and, if
  // that fails (no console node), nothing else can be printed anyway.
  (void)write(1, kMarker, sizeof(kMarker) - 1);
  sync();
  reboot(RB_POWER_OFF);
  return 1;
}
