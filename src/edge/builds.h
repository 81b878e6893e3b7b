// Image builds (issue 5): POST /v1/images/build runs a build job in the background.
//
//   {"name": "py:3.11", "base": "debian:bookworm", "packages": ["python3", "git"]}
//       bootstraps a Debian root filesystem from Debian's mirror with mmdebstrap (the tar it
//       writes is imported as it comes) and makes it one layer;
//   {"name": "proj:abc", "from": ["py:3.11"], "run": ["git clone ...", "pip install ..."]}
//       starts a sandbox from existing images, runs each command as root in it, in order, and
//       captures its writable layer (a snapshot) as the new image's top layer.
// Both may be combined (a base, then run steps). A job reports its steps, the current one,
// a bounded log (mmdebstrap's progress, the commands' output) and, at the end, the image or
// the error. States: queued -> running -> succeeded | failed, or canceled (at once when queued;
// a running build is "canceling" until its sandbox is gone and its layers are collected).
// Jobs live in the edge's memory: after a restart they are gone, and sandboxes a lost build
// left (labelled dsec.build) are deleted.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "api/builds_json.h"
#include "base/mutex.h"
#include "base/status.h"
#include "edge/config.h"
#include "edge/manager.h"
#include "images/store.h"
#include "net/policy.h"

namespace dsec::edge {

// A build as asked for, and the parse of its body (api/builds_json.h).
using api::BuildLogPiece;
using api::BuildRecord;
using api::BuildRequest;
using api::ParseBuildRequest;

namespace internal {

// Drops the head of a build log grown past `max` bytes: a quarter of `max` more than needed,
// then on to the next line start (or, when that is more than another quarter away, the next
// UTF-8 character), so the kept tail starts with a whole line. Returns the bytes dropped.
size_t TrimLogHead(std::string* log, size_t max);

// How many bytes of `text` (the log from some offset on) to return for at most `max_bytes`:
// whole UTF-8 characters only, and never 0 while `text` holds a whole character, so a reader
// always makes progress (a first character longer than max_bytes is returned whole). Unless
// `final` (nothing more will be appended), a character the log ends in the middle of waits
// for its other bytes. Bytes that are not UTF-8 are returned as they come.
size_t Utf8Prefix(std::string_view text, size_t max_bytes, bool final);

}  // namespace internal

class ClusterImages;

class Builds {
 public:
  Builds(const EdgeConfig& cfg, Manager* manager, images::ImageStore* store);
  ~Builds();  // Shutdown()
  Builds(const Builds&) = delete;
  Builds& operator=(const Builds&) = delete;

  // Deletes the sandboxes of builds a previous edge left (call after Manager::Recover).
  int CleanupLost();
  // Cancels every build and waits for them (their sandboxes are deleted). Idempotent.
  void Shutdown();

  // Queues a build; its record (state "queued" or "running"). AlreadyExists when the name is
  // taken (checked first), OverCapacity when the queue is full.
  // In a cluster (`cluster` not null): build ids name this node ("bld-<node>-<hex>", so that
  // apiservers route their calls), and each image made is published to the cluster as the
  // project's that started its build. Call before any Start.
  void SetCluster(ClusterImages* cluster);
  // `project`: whose build it is ("" for a call on the node itself: any project's calls find
  // it; in a cluster its image is then "default"'s). Get, List, Log and Cancel with a project
  // see only its builds (NotFound for another's).
  StatusOr<BuildRecord> Start(BuildRequest req, const std::string& project = "");
  StatusOr<BuildRecord> Get(const std::string& id, const std::string& project = "");
  // For an image the edge makes itself when it is first asked for: the queued or running
  // build of req.name, else one started now (a node's build, as Start(req) makes it). A build
  // of that name that failed or was canceled less than `pause_ms` ago is not started again:
  // Unavailable naming it and its error.
  StatusOr<BuildRecord> Ensure(BuildRequest req, int64_t pause_ms);
  // The builds it keeps (running, queued, and the last finished ones), newest first; only
  // those in `state` when it is not empty.
  std::vector<BuildRecord> List(const std::string& state, const std::string& project = "");
  // The log from byte `offset` (at most max_bytes).
  StatusOr<BuildLogPiece> Log(const std::string& id, uint64_t offset, uint64_t max_bytes,
                              const std::string& project = "");
  // Cancels a queued build ("canceled" at once) or a running one ("canceling" until its
  // sandbox is deleted and its layers collected, then "canceled"). A build already saving its
  // image is past canceling and stays "running"; a finished one is returned as it is.
  StatusOr<BuildRecord> Cancel(const std::string& id, const std::string& project = "");

 private:
  struct Job;
  struct Steps;  // a running build's step and log bookkeeping
  void Worker();
  void Run(const std::shared_ptr<Job>& job);
  Status RunSteps(const std::shared_ptr<Job>& job);
  // The steps, in order: a new root filesystem (--base), the build sandbox, each command, the
  // captured layer, the saved image.
  Status BootstrapStep(Steps& s, images::Image* img, std::vector<std::string>* stack);
  StatusOr<std::shared_ptr<backends::Sandbox>> SandboxStep(Steps& s,
                                                           const std::vector<std::string>& stack);
  Status CommandStep(Steps& s, backends::Sandbox& sb, const std::string& cmd);
  Status CaptureStep(Steps& s, backends::Sandbox& sb, images::Image* img);
  Status SaveStep(Steps& s, images::Image* img);
  BuildRecord RecordLocked(const Job& j) const DSEC_REQUIRES(mu_);
  void CancelRunningLocked(Job& j) DSEC_REQUIRES(mu_);
  void PruneLocked() DSEC_REQUIRES(mu_);
  // The job `id` if `project` may see it ("": any), else nullptr.
  std::shared_ptr<Job> FindLocked(const std::string& id, const std::string& project) const
      DSEC_REQUIRES(mu_);

  EdgeConfig cfg_;
  Manager* manager_;
  images::ImageStore* store_;
  ClusterImages* cluster_ = nullptr;
  Mutex mu_;
  CondVar cv_;
  std::map<std::string, std::shared_ptr<Job>> jobs_ DSEC_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Job>> queue_ DSEC_GUARDED_BY(mu_);
  bool stopping_ DSEC_GUARDED_BY(mu_) = false;
  uint64_t next_seq_ DSEC_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> workers_;
};

}  // namespace dsec::edge
