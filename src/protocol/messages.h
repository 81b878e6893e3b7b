// Typed edge <-> agent messages carried as JSON in kSetup/kRequest/kResponse/kEvent frames.
// Parsing validates types and bounds; anything malformed is an InvalidArgument Status.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/json.h"
#include "base/resources.h"
#include "base/status.h"
#include "isolation/credentials.h"
#include "isolation/rootfs.h"

namespace dsec::protocol {

// The JSON type and its getters come from base/json.h; these names keep the protocol's own
// code short.
using dsec::GetBool;
using dsec::GetInt;
using dsec::GetString;
using dsec::Json;
using dsec::ParseJson;

// Fd roles in the kSetup frame's SCM_RIGHTS array.
struct SetupFds {
  int mount_dir = -1;    // directory to attach the sandbox tmpfs on
  int listen = -1;       // listening unix socket for reconnecting edges
  int cgroup_user = -1;  // cgroup2 <sb>/user dir (may be absent)
  int first_layer = -1;  // layers follow, in order
  int layer_count = 0;
  int zygote_binary = -1;  // sealed memfd of dsec-zygote (fncall workers)
  // A detached mount (an ext4 disk image) to use as the writable layer instead of a tmpfs.
  int disk = -1;
  // The sandbox's host uid range lease (isolation/uid_ranges.h): the agent keeps it open for
  // the sandbox's whole life, so the range is never given to another sandbox meanwhile.
  int uid_lease = -1;
  int first_proc_view = -1;  // rootfs.proc_views' mounts follow, in order
};

// What the agent of an fncall worker starts once it is set up: a resident zygote
// (backends/fncall/zygote.h) that serves FnCallSpec execs by forking, one call at a time.
struct ZygoteSpec {
  std::vector<std::string> args;          // after argv[0] (the sealed binary)
  std::vector<std::string> env;           // complete environment
  std::vector<std::string> call_seccomp;  // the full profile each call installs on itself
  uint64_t caps = 0;                      // what the zygote keeps (it runs as root)
};

struct SetupSpec {
  std::string sandbox_id;
  std::string hostname;
  std::string secret;  // hex; authenticates reconnecting edges
  isolation::RootfsSpec rootfs;
  isolation::Rlimits rlimits;
  // Raw BPF programs the agent installs on itself once setup is done; every process in the
  // sandbox inherits them.
  std::vector<std::string> seccomp;
  uint64_t agent_caps = 0;  // bounding/effective set the agent keeps
  bool cgroup_kill = true;
  uint32_t max_execs = 64;  // concurrent execs + shells
  // How long the agent waits for an edge after its connection dropped before ending the
  // sandbox: -1 forever (an edge may restart and re-adopt it), 0 at once.
  int64_t orphan_timeout_ms = -1;
  std::optional<ZygoteSpec> zygote;
  SetupFds fds;
};
Json ToJson(const SetupSpec& s);
StatusOr<SetupSpec> SetupSpecFromJson(const Json& j);

// The kSetup frame of a microVM's agent (dsec-agent as the guest's init, agent/guest.h). The
// guest built its root from the image's block devices before it said hello, so what is left
// is who the sandbox is (a template's clones share one boot) and its limits; no fds (a
// virtio-serial port carries none).
struct GuestSetup {
  std::string sandbox_id;
  std::string hostname;
  std::string secret;          // hex; authenticates reconnecting edges
  int64_t realtime_ns = 0;     // the host's CLOCK_REALTIME when sent (a restored guest is behind)
  std::string entropy;         // hex; mixed into the guest's pool (clones share their seed)
  int64_t disk_mb = 0;         // the writable layer's size (its tmpfs is resized); 0 = keep
  isolation::Rlimits rlimits;  // fsize, nofile, ... for every process the agent starts
  uint32_t max_execs = 64;     // concurrent execs + shells
  int64_t orphan_timeout_ms = -1;  // see SetupSpec
  int64_t pids = 0;  // processes the user's side of the guest holds at once (0: no limit)
  // The guest's NIC (eth0), when the VM has one on the node's network: its address (a /32)
  // and the gateway reached on the link; empty: no network.
  std::string net_address, net_gateway;
  // What the writable layer starts with (rootfs_plan.h: /etc/hostname, /etc/hosts, the
  // sandbox user in /etc/passwd, the workdir), made by the guest through its root overlay.
  std::vector<isolation::DirSpec> dirs;
  std::vector<isolation::FileSpec> files;
  // A template's boot, before it is saved: only the dirs and files are made (every clone's
  // setup then finds them made and rewrites them in place: no copy-up of the image's /etc and
  // top-level directories in each clone, which TCG runs slowly); the guest answers kReady and
  // greets the next host end again. Nothing else of the setup applies.
  bool prepare = false;
};
Json ToJson(const GuestSetup& s);
StatusOr<GuestSetup> GuestSetupFromJson(const Json& j);

// A microVM restored from another VM's running state (a fork that carries memory) becomes a
// machine of its own on its first auth (protocol::Auth::identity): its hostname, the files
// that name it (/etc/hostname, /etc/hosts, /etc/machine-id), the host's clock, fresh entropy,
// and a secret of its own (its source's no longer opens it).
struct GuestIdentity {
  std::string sandbox_id;
  std::string hostname;
  std::string secret;  // hex; replaces the one the agent had
  int64_t realtime_ns = 0;
  std::string entropy;  // hex
  std::vector<isolation::FileSpec> files;
};
Json ToJson(const GuestIdentity& g);
StatusOr<GuestIdentity> GuestIdentityFromJson(const Json& j);

// A function call served by an fncall worker's zygote (instead of starting argv).
struct FnCallSpec {
  std::string code;
  std::string filename;                                    // for tracebacks; may be empty
  std::vector<std::pair<std::string, std::string>> files;  // relative path -> content
};

struct ExecSpec {
  std::optional<FnCallSpec> fncall;  // set: argv is ignored (and may be empty)
  std::vector<std::string> argv;     // argv[0] looked up in PATH from env when it has no '/'
  std::vector<std::string> env;      // complete environment, "K=V"
  std::string cwd = "/";
  uint32_t uid = kSandboxUid, gid = kSandboxGid;
  bool root_caps = false;               // keep the reduced root capability set (uid 0 only)
  int64_t timeout_ms = 0;               // 0 = none
  uint64_t max_output_bytes = 1 << 20;  // per stream
  bool stdin_stream = false;            // edge sends kData stdin frames (and EOF)
  std::string stdin_data;               // or: this, then EOF
  bool tty = false;
  uint16_t cols = 80, rows = 24;
};
Json ToJson(const FnCallSpec& f);
StatusOr<FnCallSpec> FnCallSpecFromJson(const Json& j);
Json ToJson(const ExecSpec& s);
StatusOr<ExecSpec> ExecSpecFromJson(const Json& j);

struct ExecResult {
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
  bool oom_killed = false;  // set by the edge from cgroup OOM counters
  bool stdout_truncated = false;
  bool stderr_truncated = false;
  uint64_t stdout_bytes = 0;  // total produced, including what was dropped past the cap
  uint64_t stderr_bytes = 0;
  double duration_ms = 0;
  int pid = 0;
};
Json ToJson(const ExecResult& r);
StatusOr<ExecResult> ExecResultFromJson(const Json& j);

struct FileEntry {
  std::string name;
  std::string type;  // file dir symlink fifo socket char block other
  uint64_t size = 0;
  uint32_t mode = 0;
  int64_t mtime_ms = 0;
};
Json ToJson(const FileEntry& e);
StatusOr<FileEntry> FileEntryFromJson(const Json& j);

// Error payload of a kResponse/kError: {"error": {"code", "message"}}.
Json ErrorJson(const Status& s);
// If j carries an error, the Status it names; OK otherwise.
Status StatusFromJson(const Json& j);

}  // namespace dsec::protocol
