// libFuzzer target for the tar extractor the agent runs on archive uploads (and the CLI on
// `dsec cp` downloads): each input is extracted, in the chunks a socket might deliver, into a
// fresh directory beside a canary directory; then the extracted tree is archived again with
// TarCreator. Real files are written (under $TMPDIR; scripts/fuzz points it at a directory it
// removes), so the checks are about the file system, not the parser's word:
//  - nothing appears or changes outside the extraction root (the canary directory is intact,
//    the parent holds nothing new);
//  - nothing extracted is a device, a FIFO, a socket, setuid or setgid;
//  - the bytes written stay within max_total_bytes, the entries within max_entries;
//  - the re-archived tree is a whole number of 512-byte blocks.
// A violation traps.
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "archive/tar.h"
#include "base/file_util.h"
#include "base/testing/fuzz_dirs.h"
#include "base/unique_fd.h"

namespace {

constexpr uint64_t kMaxBytes = 1 << 20;
constexpr uint64_t kMaxEntries = 256;

using dsec::testing::CheckOutsideUntouched;
using Dirs = dsec::testing::FuzzDirs;

const Dirs& TheDirs() { return dsec::testing::TheFuzzDirs("tarfuzz"); }

uint64_t g_bytes = 0, g_entries = 0;

int Inspect(const char* path, const struct stat* st, int type, FTW*) {
  (void)path;
  if (type == FTW_F && !S_ISREG(st->st_mode)) __builtin_trap();  // device, FIFO, socket
  if (st->st_mode & (S_ISUID | S_ISGID)) __builtin_trap();
  if (S_ISREG(st->st_mode)) g_bytes += static_cast<uint64_t>(st->st_size);
  ++g_entries;
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Dirs& d = TheDirs();
  std::string_view in(reinterpret_cast<const char*>(data), size);
  // The first byte picks the chunking: single bytes, or 512..1536-byte reads.
  uint8_t pick = size ? data[0] : 0;
  size_t chunk = pick % 4 == 0 ? 1 : 512 * (pick % 3 + 1);
  if (!in.empty()) in.remove_prefix(1);

  if (mkdir(d.root.c_str(), 0755) != 0) abort();
  {
    dsec::UniqueFd root(open(d.root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root) abort();
    dsec::archive::TarExtractOptions opts;
    opts.uid = geteuid();
    opts.gid = getegid();
    opts.max_total_bytes = kMaxBytes;
    opts.max_entries = kMaxEntries;
    dsec::archive::TarExtractor x(root.get(), opts);
    bool ok = true;
    for (size_t off = 0; off < in.size() && ok; off += chunk)
      ok = x.Feed(in.substr(off, chunk)).ok();
    if (ok) (void)x.Finish();
    if (x.stats().bytes > kMaxBytes || x.stats().entries > kMaxEntries) __builtin_trap();

    CheckOutsideUntouched(d);
    g_bytes = g_entries = 0;
    if (nftw(d.root.c_str(), Inspect, 16, FTW_PHYS) != 0) abort();
    // Bytes on disk: what was written, plus nothing else (the root itself is one entry).
    if (g_bytes > kMaxBytes || g_entries > kMaxEntries + 1) __builtin_trap();

    auto creator = dsec::archive::TarCreator::Open(root.get(), ".");
    if (creator.ok()) {
      std::string out;
      uint64_t total = 0;
      while (true) {
        out.clear();
        auto more = (*creator)->Next(&out, 64 << 10);
        if (!more.ok()) break;
        total += out.size();
        if (!*more) {
          if (total % 512 != 0) __builtin_trap();
          break;
        }
      }
    }
  }
  if (!dsec::RemoveTree(d.root).ok()) abort();
  return 0;
}
