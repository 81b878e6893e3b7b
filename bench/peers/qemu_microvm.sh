#!/bin/bash
# The qemu-microvm peer: QEMU's `microvm` machine booting a Debian cloud kernel (PVH entry of
# an ELF vmlinux, no firmware, no PCI) with a tiny initramfs whose /init prints a marker and
# powers off; one run = spawn QEMU -> kernel boot -> init -> power off -> QEMU exits.
#   qemu_microvm.sh prepare DIR   fetch the kernel (microvm_kernel.sh), build /init and the
#                                 initramfs, pick the accelerator (KVM if a guest boots under
#                                 it, else TCG, with the reason), smoke-boot once
#   qemu_microvm.sh run DIR       one boot; exit 0 only if the marker was seen
# DIR/accel holds the accelerator and DIR/why why it was chosen.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:?usage: qemu_microvm.sh prepare|run DIR}
dir=${2:?usage: qemu_microvm.sh prepare|run DIR}
MARKER=DSEC-MICROVM-INIT-OK

boot() { # accel timeout_s -> output on stdout, QEMU's exit status
  local cpu=max
  [ "$1" = kvm ] && cpu=host
  timeout "$2" qemu-system-x86_64 -M microvm -accel "$1" -cpu "$cpu" -m 256M -smp 1 \
    -nodefaults -no-user-config -nographic -serial stdio -no-reboot \
    -kernel "$(cat "$dir/kernel")" -initrd "$dir/initramfs.gz" \
    -append "console=ttyS0 quiet panic=-1 pci=off tsc_early_khz=$(cat "$dir/tsc_khz")" 2>&1
}

case $cmd in
  prepare)
    command -v qemu-system-x86_64 >/dev/null || { echo "no qemu-system-x86_64" >&2; exit 1; }
    command -v gcc >/dev/null || { echo "no gcc" >&2; exit 1; }
    mkdir -p "$dir"
    "$here/microvm_kernel.sh" > "$dir/kernel"
    gcc -static -O2 -o "$dir/init" "$here/microvm_init.c"
    /usr/bin/python3 "$here/mkinitramfs.py" "$dir/init" "$dir/initramfs.gz"
    # Without a timer to calibrate the TSC against (microvm has no HPET/ACPI PM timer), a
    # TCG guest hangs at boot; give it the host's TSC rate (TCG's rdtsc reads the host TSC).
    awk -F: '/^cpu MHz/ { printf "%d\n", $2 * 1000; exit }' /proc/cpuinfo > "$dir/tsc_khz"
    accel=tcg why="TCG: no /dev/kvm"
    if [ -w /dev/kvm ]; then
      if out=$(boot kvm 20) && grep -q "$MARKER" <<< "$out"; then
        accel=kvm why="KVM"
      else
        why="TCG: a Linux guest does not boot under KVM on this host ($(grep -m1 -i 'error\|fail' <<< "$out" || echo "no marker"))"
      fi
    fi
    echo "$accel" > "$dir/accel"
    echo "$why" > "$dir/why"
    out=$(boot "$accel" 120) && grep -q "$MARKER" <<< "$out" ||
      { echo "qemu_microvm: smoke boot ($accel) failed: $(tail -3 <<< "$out")" >&2; exit 1; }
    echo "$why"
    ;;
  run)
    out=$(boot "$(cat "$dir/accel")" 120) || exit 1
    [[ $out == *"$MARKER"* ]]
    ;;
  *) echo "usage: qemu_microvm.sh prepare|run DIR" >&2; exit 2 ;;
esac
