// MicroVM templates kept on disk, so a restarted edge restores creates from the templates it
// made before instead of booting each set again (a cold boot is seconds on TCG).
//
// A template is a directory <dir>/<name>/ holding `ram` (the guest's RAM, sparse: only the
// pages the guest touched), `state` (the migration stream) and `meta.json` (the template's key,
// the environment it was made in, sizes and sha256 digests). <name> is a digest of key and
// environment. The environment is what a saved VM depends on beyond its key: the guest
// kernel and initramfs (the agent is in it), the QEMU binary and the accelerator; a template
// of another environment is never loaded (and is pruned). Written to a temporary directory,
// synced and renamed into place, so a crash leaves no half template; loaded into fresh memfds
// (the digests checked) and sealed like a template made in this run. At most `max` are kept,
// the least recently used removed first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace dsec::backends::microvm {

struct Template;

class TemplateFiles {
 public:
  TemplateFiles(std::string dir, size_t max) : dir_(std::move(dir)), max_(max) {}

  // Digests the environment's files (kernel, initramfs, QEMU binary) once; `accel` is the
  // accelerator's name. Removes leftovers of interrupted saves.
  Status Init(const std::string& kernel, const std::string& initramfs, const std::string& qemu,
              const std::string& accel);
  bool ready() const { return !env_.empty(); }

  // The template of `key` saved earlier in this environment: NotFound when there is none; any
  // other error (a damaged one, which is then removed) means it cannot be used.
  StatusOr<std::unique_ptr<Template>> Load(const std::string& key);
  // Keeps `t` (its memfds sealed), then prunes beyond `max`.
  Status Save(const Template& t);

  const std::string& dir() const { return dir_; }

 private:
  std::string NameOf(const std::string& key) const;
  void Prune();

  std::string dir_;
  size_t max_;
  std::string env_;  // a digest of the environment ("" before Init)
};

}  // namespace dsec::backends::microvm
