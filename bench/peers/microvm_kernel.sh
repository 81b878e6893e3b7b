#!/bin/bash
# Fetches the Debian cloud kernel the qemu-microvm peer boots and prints the path of an
# uncompressed ELF vmlinux (QEMU's -kernel boots an ELF with a PVH note directly).
# Reproducible: the package is the one linux-image-cloud-amd64 depends on (apt-get download
# from the configured Debian mirror), unpacked with dpkg-deb, and the vmlinux is extracted from
# the bzImage by finding the compressed payload's magic and decompressing it.
# Usage: microvm_kernel.sh [CACHE_DIR]   (default /var/cache/dsec-bench)
set -euo pipefail
cache=${1:-/var/cache/dsec-bench}
pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
  sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -1)
[ -n "$pkg" ] || { echo "microvm_kernel: no linux-image-cloud-amd64 in apt's lists" >&2; exit 1; }
ver=${pkg#linux-image-}
out="$cache/vmlinux-$ver"
if [ -s "$out" ]; then echo "$out"; exit 0; fi
mkdir -p "$cache"
work=$(mktemp -d "$cache/tmp-XXXXXX")
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -qq "$pkg" >/dev/null 2>&1) ||
  { echo "microvm_kernel: apt-get download $pkg failed" >&2; exit 1; }
dpkg-deb -x "$work"/"$pkg"_*.deb "$work/x"
bz="$work/x/boot/vmlinuz-$ver"
[ -f "$bz" ] || { echo "microvm_kernel: $bz not in the package" >&2; exit 1; }
# Extract the ELF vmlinux from the bzImage: the boot header says where the compressed payload
# is (setup_sects at 0x1f1, payload_offset/payload_length at 0x248, relative to the protected-
# mode code after the setup sectors); its magic says which decompressor to use. The payload
# ends in a 4-byte size word, so the tools' exit status is ignored and the ELF magic checked.
u8() { od -An -tu1 -j "$1" -N 1 "$bz" | tr -d ' '; }
u32() { od -An -tu4 -j "$1" -N 4 "$bz" | tr -d ' '; }
setup=$(u8 $((0x1f1))); [ "$setup" = 0 ] && setup=4
start=$(( (setup + 1) * 512 + $(u32 $((0x248))) ))
len=$(u32 $((0x24c)))
magic=$(od -An -tx1 -j "$start" -N 6 "$bz" | tr -d ' \n')
case $magic in
  fd377a585a00*) dec=(xz -dc --single-stream) ;;
  28b52ffd*) dec=(zstd -dcq) ;;
  1f8b*) dec=(gzip -dc) ;;
  02214c18*) dec=(lz4 -dc) ;;
  425a68*) dec=(bzip2 -dc) ;;
  *) echo "microvm_kernel: unknown payload magic $magic in $bz" >&2; exit 1 ;;
esac
command -v "${dec[0]}" >/dev/null || { echo "microvm_kernel: need ${dec[0]}" >&2; exit 1; }
tail -c +"$((start + 1))" "$bz" | head -c "$len" | "${dec[@]}" > "$work/vmlinux" 2>/dev/null || true
if [ "$(head -c 4 "$work/vmlinux" | od -An -tx1 | tr -d ' ')" != 7f454c46 ]; then
  echo "microvm_kernel: ${dec[0]} did not give an ELF vmlinux from $bz" >&2; exit 1
fi
mv "$work/vmlinux" "$out.tmp" && mv "$out.tmp" "$out"
echo "$out"
