// The built-in "host" image: an allowlist of the host's system dirs (/usr, /bin, /sbin, /lib*,
// /etc, /opt), read-only, and nothing else of the host: never /root, /home, /var, /run, /srv,
// /mnt, /tmp, nor the edge's own files.
//
// It is one overlay rooted at "/" whose lowers are a generated mask layer above the host's root
// filesystem. The mask layer is a small detached tmpfs the edge holds by fd (it must not live on
// the root filesystem: overlay refuses overlapping layers); it is never modified after it was
// built, and each sandbox gets its own (idmapped) clone of it. It holds
//  - overlay whiteouts for every top-level entry of / that is not allowlisted, so the sandbox
//    sees /usr, /etc, ... and nothing else (mount points such as /proc and /dev show only as
//    the root filesystem's empty directories, since overlay lowers do not cross mounts);
//  - whiteouts for secrets (/etc/shadow, gshadow, ssh host keys, ssl/private, ...) and for
//    every path of the edge's own (state dir, token, config, socket, logs) under an allowed dir;
//  - whiteouts for every entry under /etc and /opt that is not world-readable;
//  - /etc/passwd and /etc/group with the `sandbox` user (uid/gid 1000, HOME /workspace)
//    replacing any host entry with that name or id.
// An allowlisted dir on a different filesystem than / gets an overlay of its own.
// Because entries could appear on the host later, the backend re-checks /, /etc and /opt
// (three stats) at each create and rebuilds the mask when one changed; changes deeper down are
// picked up at the next rebuild.
// Privileges: host root (mknod of whiteouts). Called by the container backend.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/resources.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "isolation/rootfs.h"

namespace dsec::isolation {

struct HostImageOptions {
  std::vector<std::string> dirs = {"/usr",   "/bin",    "/sbin", "/lib", "/lib32",
                                   "/lib64", "/libx32", "/etc",  "/opt"};
  // Paths under /etc to hide (glob patterns relative to /etc).
  std::vector<std::string> etc_secrets = {"shadow",
                                          "shadow-",
                                          "gshadow",
                                          "gshadow-",
                                          "ssh/ssh_host_*_key",
                                          "ssl/private",
                                          "security/opasswd",
                                          "krb5.keytab",
                                          "NetworkManager/system-connections",
                                          "wpa_supplicant",
                                          "letsencrypt",
                                          "dsec"};
  // Absolute host paths of the edge's own files, hidden wherever they fall under `dirs`.
  std::vector<std::string> hidden_paths;
  uint32_t sandbox_uid = kSandboxUid;
  uint32_t sandbox_gid = kSandboxGid;
};

// A lower layer: a host directory, or a detached mount the edge made (the mask).
struct HostLayer {
  std::string host_path;                  // when mount is null
  std::shared_ptr<const UniqueFd> mount;  // detached tmpfs, read-only
  std::string Describe() const { return mount ? "(mask)" : host_path; }
};

struct HostImage {
  std::vector<HostLayer> layers;       // handed to each sandbox as read-only layer mounts
  std::vector<OverlaySpec> overlays;   // lower_fds index into layers; the first targets "/"
  std::vector<int64_t> watch_mtimes;   // of /, /etc and /opt when the mask was computed
  std::vector<std::string> whiteouts;  // what the mask hides (for diagnostics and tests)

  static StatusOr<HostImage> Prepare(const HostImageOptions& opts);
  // True if /, /etc or /opt changed since Prepare (an entry added or removed directly inside).
  bool Stale() const;
};

// passwd/group content with the sandbox user replacing any conflicting entry.
std::string PasswdWithSandboxUser(const std::string& host_passwd, uint32_t uid, uint32_t gid,
                                  const std::string& shell);
std::string GroupWithSandboxUser(const std::string& host_group, uint32_t gid);

}  // namespace dsec::isolation
