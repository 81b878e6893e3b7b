// The built-in "host" image: an allowlist of the host's system dirs (/usr, /bin, /sbin, /lib*,
// /etc, /opt), read-only and never /root, /home, /var, /run, /srv, /mnt. Each allowed
// directory becomes an overlay in the sandbox whose lowers are a generated mask layer and the
// host directory. The mask layer (built once per distinct content, never modified after) holds
//  - overlay whiteouts for secrets (/etc/shadow, gshadow, ssh host keys, ssl/private, ...) and
//    for every path of the edge's own (state dir, token, config, socket, logs) that lies
//    under an allowed dir, so they do not exist inside the sandbox at all;
//  - /etc/passwd and /etc/group with the `sandbox` user (uid/gid 1000, HOME /workspace)
//    replacing any host entry with that name or id.
// Symlinked entries (merged-/usr hosts: /bin -> usr/bin) are reproduced as symlinks.
// Privileges: host root (mknod of whiteouts). Called by the container backend at start.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "isolation/rootfs.h"

namespace dsec::isolation {

struct HostImageOptions {
  std::string store_dir;  // where generated mask layers live (under the edge's state dir)
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
  uint32_t sandbox_uid = 1000;
  uint32_t sandbox_gid = 1000;
};

struct HostImage {
  // Host paths to hand to each sandbox as read-only layer mounts, in index order.
  std::vector<std::string> layer_paths;
  std::vector<OverlaySpec> overlays;  // lower_fds index into layer_paths
  std::vector<SymlinkSpec> symlinks;
  std::string mask_dir;  // the generated layer set in use

  static StatusOr<HostImage> Prepare(const HostImageOptions& opts);
};

// passwd/group content with the sandbox user replacing any conflicting entry.
std::string PasswdWithSandboxUser(const std::string& host_passwd, uint32_t uid, uint32_t gid,
                                  const std::string& shell);
std::string GroupWithSandboxUser(const std::string& host_group, uint32_t gid);

}  // namespace dsec::isolation
