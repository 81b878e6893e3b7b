#include "agent/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/fsuid.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <vector>

#include "archive/tar.h"
#include "base/file_util.h"
#include "base/in_root.h"
#include "base/strings.h"

namespace dsec::agent {

using protocol::FrameType;
using protocol::Json;

namespace {

// Archives larger than this are refused even when the caller names no smaller max_bytes.
constexpr uint64_t kMaxArchiveBytes = 4ull << 30;

// The fs ids of the requesting user for the duration of one step of an operation. Switching
// fsuid away from 0 also drops the file system capabilities (DAC_OVERRIDE, FOWNER, ...).
class ScopedFsIds {
 public:
  ScopedFsIds(uid_t uid, gid_t gid) {
    setfsgid(gid);
    setfsuid(uid);
  }
  ~ScopedFsIds() {
    setfsuid(0);
    setfsgid(0);
    // Changing fs ids resets "dumpable" to fs.suid_dumpable, which a host may set to 1: the
    // agent must never become readable through /proc/1 by root in the sandbox.
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  }
  ScopedFsIds(const ScopedFsIds&) = delete;
  ScopedFsIds& operator=(const ScopedFsIds&) = delete;
};

using Ids = protocol::RunAs;

int RootFd() {
  static int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  return fd;
}

// Every lookup: from the sandbox's root, symlinks and ".." clamped inside it.
StatusOr<UniqueFd> Resolve(const std::string& path, int flags, mode_t mode = 0) {
  return OpenInRoot(RootFd(), path, flags, InRoot::kFollowInside, mode);
}

Status RefuseKernelFs(int fd, const std::string& path) {
  struct statfs sf;
  if (fstatfs(fd, &sf) < 0) return ErrnoError("statfs \"" + path + "\"");
  switch (static_cast<unsigned long>(sf.f_type)) {
    case PROC_SUPER_MAGIC:
    case SYSFS_MAGIC:
    case CGROUP_SUPER_MAGIC:
    case CGROUP2_SUPER_MAGIC:
    case DEVPTS_SUPER_MAGIC:
      return PermissionDenied("\"" + path + "\" is on a kernel file system");
    default:
      return OkStatus();
  }
}

std::pair<std::string, std::string> SplitParent(const std::string& path) {
  auto slash = path.find_last_of('/');
  std::string parent = slash == 0 ? "/" : path.substr(0, slash);
  return {parent, path.substr(slash + 1)};
}

// Like mkdir -p inside the sandbox root (base/in_root.h), as the caller's fs ids; *created (if
// given) gets the paths of the directories this call made, outermost first. Returns an O_PATH
// fd of the directory.
StatusOr<UniqueFd> MakeDirs(const std::string& path, mode_t mode,
                            std::vector<std::string>* created = nullptr) {
  std::vector<std::string> comps;
  for (auto comp : SplitString(path, '/', true)) comps.emplace_back(comp);
  MakeDirsOptions md;
  md.mode = mode;
  md.created = created;
  return MakeDirsInRoot(RootFd(), comps, InRoot::kFollowInside, md);
}

std::string TypeName(mode_t m) {
  if (S_ISREG(m)) return "file";
  if (S_ISDIR(m)) return "dir";
  if (S_ISLNK(m)) return "symlink";
  if (S_ISFIFO(m)) return "fifo";
  if (S_ISSOCK(m)) return "socket";
  if (S_ISCHR(m)) return "char";
  if (S_ISBLK(m)) return "block";
  return "other";
}

protocol::FileEntry EntryFromStat(const std::string& name, const struct stat& st) {
  protocol::FileEntry e;
  e.name = name;
  e.type = TypeName(st.st_mode);
  e.size = static_cast<uint64_t>(st.st_size);
  e.mode = st.st_mode & 07777;
  e.mtime_ms = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
  return e;
}

// Removes a tree without following symlinks or crossing into other mounts, at most
// kMaxRemoveDepth levels deep (the agent's stack and fds are not the sandbox's to exhaust).
constexpr int kMaxRemoveDepth = 256;
Status RemoveTreeAt(int parent, const std::string& name, dev_t dev, const std::string& what,
                    int depth = 0) {
  if (depth > kMaxRemoveDepth)
    return InvalidArgument("\"" + what.substr(0, 256) + "...\" is nested too deeply to remove");
  struct stat st;
  if (fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0)
    return ErrnoError("stat \"" + what + "\"");
  if (!S_ISDIR(st.st_mode)) {
    if (unlinkat(parent, name.c_str(), 0) < 0) return ErrnoError("unlink \"" + what + "\"");
    return OkStatus();
  }
  if (st.st_dev != dev) return PermissionDenied("\"" + what + "\" is a mount point");
  int fd = openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open \"" + what + "\"");
  DIR* d = fdopendir(fd);
  if (!d) {
    close(fd);
    return ErrnoError("opendir \"" + what + "\"");
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(std::move(n));
  }
  Status result;
  for (const auto& n : names) {
    result = RemoveTreeAt(dirfd(d), n, dev, what + "/" + n, depth + 1);
    if (!result.ok()) break;
  }
  closedir(d);
  DSEC_RETURN_IF_ERROR(result);
  if (unlinkat(parent, name.c_str(), AT_REMOVEDIR) < 0) return ErrnoError("rmdir \"" + what + "\"");
  return OkStatus();
}

// --- streaming ops ---

class ReadFileOp : public Op {
 public:
  ReadFileOp(Agent* a, uint32_t ch, UniqueFd fd, uint64_t size, uint64_t max_bytes)
      : Op(a, ch), fd_(std::move(fd)), size_(size), remaining_(std::min(size, max_bytes)) {}

  void Begin() override {
    agent_->SendJson(FrameType::kEvent, channel_, {{"size", size_}});
    OnRoom();
  }

  void OnRoom() override {
    char buf[protocol::kDataChunk];
    while (remaining_ > 0) {
      if (!agent_->OutputHasRoom()) {
        agent_->WaitForRoom(this);
        return;
      }
      ssize_t n = read(fd_.get(), buf, std::min<uint64_t>(sizeof buf, remaining_));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return agent_->FinishWithError(this, ErrnoError("read"));
      if (n == 0) break;  // the file shrank
      agent_->Send(FrameType::kData, protocol::kBody, channel_,
                   std::string_view(buf, static_cast<size_t>(n)));
      sent_ += static_cast<uint64_t>(n);
      remaining_ -= static_cast<uint64_t>(n);
    }
    agent_->Finish(this, {{"size", size_}, {"bytes", sent_}, {"truncated", sent_ < size_}});
  }

  void Cancel() override {}

 private:
  UniqueFd fd_;
  uint64_t size_, remaining_, sent_ = 0;
};

class WriteFileOp : public Op {
 public:
  WriteFileOp(Agent* a, uint32_t ch, UniqueFd fd, std::string path, mode_t mode, Ids ids)
      : Op(a, ch), fd_(std::move(fd)), path_(std::move(path)), mode_(mode), ids_(ids) {}

  void OnData(const protocol::Frame& f) override {
    if (failed_) return;
    ScopedFsIds as(ids_.uid, ids_.gid);
    std::string_view d = f.payload;
    while (!d.empty()) {
      ssize_t n = write(fd_.get(), d.data(), d.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        failed_ = true;
        return agent_->FinishWithError(this, ErrnoError("write \"" + path_ + "\""));
      }
      d.remove_prefix(static_cast<size_t>(n));
      bytes_ += static_cast<uint64_t>(n);
    }
    if (f.eof()) {
      if (fchmod(fd_.get(), mode_) < 0) {
        failed_ = true;
        return agent_->FinishWithError(this, ErrnoError("chmod \"" + path_ + "\""));
      }
      fd_.Reset();
      agent_->Finish(this, {{"bytes", bytes_}});
    }
  }

  void Cancel() override {}

 private:
  UniqueFd fd_;
  std::string path_;
  mode_t mode_;
  Ids ids_;
  uint64_t bytes_ = 0;
  bool failed_ = false;
};

class TarExtractOp : public Op {
 public:
  // made: the directories the op created for its target (MakeDirs), removed again if the
  // archive is refused before anything was extracted: a refused upload leaves no trace.
  TarExtractOp(Agent* a, uint32_t ch, UniqueFd dir, Ids ids, uint64_t max_bytes,
               std::vector<std::string> made)
      : Op(a, ch),
        dir_(std::move(dir)),
        ids_(ids),
        made_(std::move(made)),
        extractor_(dir_.get(), archive::TarExtractOptions{ids.uid, ids.gid, max_bytes, 1'000'000}) {
  }

  void OnData(const protocol::Frame& f) override {
    if (failed_) return;
    ScopedFsIds as(ids_.uid, ids_.gid);
    Status s = extractor_.Feed(f.payload);
    if (s.ok() && f.eof()) s = extractor_.Finish();
    if (!s.ok()) {
      failed_ = true;
      if (extractor_.stats().entries == 0) RemoveMade();
      return agent_->FinishWithError(this, s);
    }
    if (f.eof()) {
      const auto& st = extractor_.stats();
      agent_->Finish(this, {{"entries", st.entries}, {"bytes", st.bytes}, {"skipped", st.skipped}});
    }
  }

  void Cancel() override {}

 private:
  void RemoveMade() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
      size_t slash = it->rfind('/');
      std::string parent = slash == 0 || slash == std::string::npos ? "/" : it->substr(0, slash);
      auto pfd = Resolve(parent, O_PATH | O_DIRECTORY);
      if (!pfd.ok() || unlinkat(pfd->get(), it->substr(slash + 1).c_str(), AT_REMOVEDIR) < 0)
        return;  // not empty (or replaced): keep it and its parents
    }
  }

  UniqueFd dir_;
  Ids ids_;
  std::vector<std::string> made_;
  archive::TarExtractor extractor_;
  bool failed_ = false;
};

// Stops with kTooLarge once the archive passes max_bytes: the caller only keeps that much, so
// streaming the rest (a 1 TB sparse file is 1 TB of zeros) would be work for nobody.
class TarCreateOp : public Op {
 public:
  TarCreateOp(Agent* a, uint32_t ch, std::unique_ptr<archive::TarCreator> c, Ids ids,
              std::string path, uint64_t max_bytes)
      : Op(a, ch), creator_(std::move(c)), ids_(ids), path_(std::move(path)), max_(max_bytes) {}

  void Begin() override { OnRoom(); }

  void OnRoom() override {
    ScopedFsIds as(ids_.uid, ids_.gid);
    std::string chunk;
    while (true) {
      if (!agent_->OutputHasRoom()) {
        agent_->WaitForRoom(this);
        return;
      }
      chunk.clear();
      // One byte past the limit is enough to tell an archive that does not fit.
      auto more = creator_->Next(
          &chunk, static_cast<size_t>(std::min<uint64_t>(protocol::kDataChunk, max_ - bytes_ + 1)));
      if (!more.ok()) return agent_->FinishWithError(this, more.status());
      // (what the headers handed out promise counts: a 1 TB file is refused at its header)
      if (bytes_ + chunk.size() > max_ || creator_->owed() > max_ - bytes_ - chunk.size()) {
        return agent_->FinishWithError(this,
                                       TooLarge("the archive of \"" + path_ + "\" is larger than " +
                                                std::to_string(max_) + " bytes"));
      }
      if (!chunk.empty()) {
        agent_->Send(FrameType::kData, protocol::kBody, channel_, chunk);
        bytes_ += chunk.size();
      }
      if (!*more) break;
    }
    agent_->Finish(this, {{"bytes", bytes_}, {"skipped", creator_->skipped()}});
  }

  void Cancel() override {}

 private:
  std::unique_ptr<archive::TarCreator> creator_;
  Ids ids_;
  std::string path_;
  uint64_t max_;
  uint64_t bytes_ = 0;
};

// watch_dir: an inotify instance over the directory (and, recursive, those below it), read
// as the agent's loop says it is readable, its events sent in batches. Stops reading while the
// outgoing queue is full (the kernel's own queue then overflows, which is reported).
int g_watch_ops = 0;

class WatchOp : public Op, public EventHandler {
 public:
  WatchOp(Agent* agent, uint32_t channel, protocol::WatchDirRequest req)
      : Op(agent, channel), req_(std::move(req)) {
    ++g_watch_ops;
  }
  ~WatchOp() override {
    Close();
    --g_watch_ops;
  }

  void Begin() override {
    if (g_watch_ops > protocol::kMaxWatchOps)
      return Fail(ResourceExhausted("the sandbox already has " +
                                    std::to_string(protocol::kMaxWatchOps) + " watches"));
    ino_.Reset(inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    if (!ino_) return Fail(ErrnoError("inotify_init1"));
    {
      ScopedFsIds as(req_.as.uid, req_.as.gid);
      auto dir = Resolve(req_.path, O_RDONLY | O_DIRECTORY);
      if (!dir.ok()) return Fail(dir.status());
      if (Status s = AddTree(dir->get(), "", 0); !s.ok()) return Fail(s);
    }
    if (Status s = agent_->loop().Add(ino_.get(), EPOLLIN, this); !s.ok()) return Fail(s);
    registered_ = true;
    agent_->SendJson(FrameType::kEvent, channel_, {{"watching", true}});
  }

  void OnEvent(uint32_t) override { Read(); }
  void OnRoom() override {
    waiting_room_ = false;
    if (!done_) Read();
  }
  void OnControl(const Json& j) override {
    if (j.contains("close") && !done_) {
      done_ = true;
      Close();
      agent_->Finish(this, Json::object());
    }
  }
  void Cancel() override {
    done_ = true;
    Close();
  }

 private:
  static constexpr uint32_t kMask = IN_CREATE | IN_MODIFY | IN_DELETE | IN_DELETE_SELF |
                                    IN_MOVED_FROM | IN_MOVED_TO | IN_MOVE_SELF | IN_ATTRIB |
                                    IN_ONLYDIR | IN_EXCL_UNLINK;
  static constexpr int kMaxDepth = 64;

  // Watches `dir` (an open directory, `rel` below the watched one) and, recursive, the
  // directories under it. Runs with the caller's fs ids.
  Status AddTree(int dir, const std::string& rel, int depth) {
    if (dirs_.size() >= req_.max_dirs)
      return ResourceExhausted("more than " + std::to_string(req_.max_dirs) +
                               " directories to watch under \"" + req_.path + "\"");
    // The open directory itself (its /proc/self/fd link followed: no path looked up again),
    // or its path, not followed, where no /proc is.
    int wd = inotify_add_watch(ino_.get(), ("/proc/self/fd/" + std::to_string(dir)).c_str(), kMask);
    if (wd < 0 && errno == ENOENT)
      wd = inotify_add_watch(ino_.get(), JoinRel(req_.path, rel).c_str(), kMask | IN_DONT_FOLLOW);
    if (wd < 0) return ErrnoError("watch \"" + JoinRel(req_.path, rel) + "\"");
    dirs_[wd] = rel;
    if (!req_.recursive || depth >= kMaxDepth) return OkStatus();
    UniqueFd copy(openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    DIR* d = copy ? fdopendir(copy.get()) : nullptr;
    if (!d) return OkStatus();  // unreadable: its own events only
    (void)copy.Release();       // the DIR owns it now
    Status out = OkStatus();
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == ".." || (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN)) continue;
      UniqueFd sub(openat(dirfd(d), n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!sub) continue;  // not a directory, gone, or not ours to read
      struct stat st, parent;
      if (fstat(sub.get(), &st) < 0 || fstat(dirfd(d), &parent) < 0 || st.st_dev != parent.st_dev)
        continue;  // another filesystem (a mount): not crossed
      out = AddTree(sub.get(), rel.empty() ? n : rel + "/" + n, depth + 1);
      if (!out.ok()) break;
    }
    closedir(d);
    return out;
  }

  static std::string JoinRel(const std::string& a, const std::string& b) {
    if (b.empty()) return a;
    return a.back() == '/' ? a + b : a + "/" + b;
  }

  void Read() {
    if (done_) return;
    alignas(inotify_event) char buf[64 << 10];
    while (!done_) {
      if (!agent_->OutputHasRoom()) {
        if (!waiting_room_) agent_->WaitForRoom(this);
        waiting_room_ = true;
        return;
      }
      ssize_t n = read(ino_.get(), buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) return;
        return Fail(ErrnoError("read inotify"));
      }
      Json batch = Json::array();
      bool gone = false;
      for (ssize_t off = 0; off < n;) {
        auto* ev = reinterpret_cast<inotify_event*>(buf + off);
        off += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
        if (ev->mask & IN_Q_OVERFLOW) {
          agent_->SendJson(FrameType::kEvent, channel_, {{"overflow", true}});
          continue;
        }
        auto it = dirs_.find(ev->wd);
        if (it == dirs_.end()) continue;
        const std::string rel = it->second;
        if (ev->mask & IN_IGNORED) {
          dirs_.erase(it);
          if (rel.empty()) gone = true;  // the watched directory itself went
          continue;
        }
        std::string name = ev->len ? std::string(ev->name) : "";
        std::string path = rel.empty() ? name : name.empty() ? rel : rel + "/" + name;
        if ((ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) && !rel.empty())
          continue;  // seen from its parent
        const char* type = (ev->mask & (IN_CREATE | IN_MOVED_TO))        ? "create"
                           : (ev->mask & IN_MODIFY)                      ? "write"
                           : (ev->mask & (IN_DELETE | IN_DELETE_SELF))   ? "remove"
                           : (ev->mask & (IN_MOVED_FROM | IN_MOVE_SELF)) ? "rename"
                           : (ev->mask & IN_ATTRIB)                      ? "chmod"
                                                                         : nullptr;
        if (!type) continue;
        protocol::WatchEvent we{path, type, std::nullopt};
        if ((req_.include_entry || (req_.recursive && (ev->mask & IN_ISDIR))) && !name.empty()) {
          ScopedFsIds as(req_.as.uid, req_.as.gid);
          auto fd = Resolve(JoinRel(req_.path, path), O_PATH | O_NOFOLLOW);
          struct stat st;
          if (fd.ok() && fstat(fd->get(), &st) == 0) {
            if (req_.include_entry) we.entry = EntryFromStat(name, st);
            // A directory made (or moved in) under a recursive watch is watched too.
            if (req_.recursive && (ev->mask & (IN_CREATE | IN_MOVED_TO)) && S_ISDIR(st.st_mode)) {
              auto dir = Resolve(JoinRel(req_.path, path), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
              if (dir.ok()) (void)AddTree(dir->get(), path, 1);
            }
          }
        }
        batch.push_back(protocol::ToJson(we));
        if (batch.size() >= protocol::kMaxWatchBatch) {
          agent_->SendJson(FrameType::kEvent, channel_, {{"fs", std::move(batch)}});
          batch = Json::array();
        }
      }
      if (!batch.empty()) agent_->SendJson(FrameType::kEvent, channel_, {{"fs", std::move(batch)}});
      if (gone) return Fail(NotFound("the watched directory \"" + req_.path + "\" was removed"));
    }
  }

  void Fail(const Status& s) {
    if (done_) return;
    done_ = true;
    Close();
    agent_->FinishWithError(this, s);
  }
  void Close() {
    if (registered_) agent_->loop().Remove(ino_.get());
    registered_ = false;
    ino_.Reset();
  }

  protocol::WatchDirRequest req_;
  UniqueFd ino_;
  std::map<int, std::string> dirs_;  // watch descriptor -> path below the watched directory
  bool registered_ = false, done_ = false, waiting_room_ = false;
};

}  // namespace

// Every handler runs with the requesting user's fs ids: the kernel checks permissions as that
// user, and what it creates is theirs.

StatusOr<Reply> HandleReadFile(Agent* agent, uint32_t ch, protocol::ReadFileRequest req) {
  ScopedFsIds as(req.as.uid, req.as.gid);
  const std::string& path = req.path;
  // O_NONBLOCK: opening a FIFO must not hang the agent.
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, Resolve(path, O_RDONLY | O_NONBLOCK | O_NOCTTY));
  struct stat st;
  if (fstat(fd.get(), &st) < 0) return ErrnoError("stat \"" + path + "\"");
  if (S_ISDIR(st.st_mode)) return InvalidArgument("\"" + path + "\" is a directory");
  if (!S_ISREG(st.st_mode)) return InvalidArgument("\"" + path + "\" is not a regular file");
  DSEC_RETURN_IF_ERROR(RefuseKernelFs(fd.get(), path));
  fcntl(fd.get(), F_SETFL, 0);
  if (req.offset > 0 && lseek(fd.get(), static_cast<off_t>(req.offset), SEEK_SET) < 0)
    return ErrnoError("seek \"" + path + "\"");
  uint64_t size = static_cast<uint64_t>(st.st_size);
  uint64_t avail = size > req.offset ? size - req.offset : 0;
  return Reply(std::make_unique<ReadFileOp>(agent, ch, std::move(fd), avail, req.max_bytes));
}

StatusOr<Reply> HandleWriteFile(Agent* agent, uint32_t ch, protocol::WriteFileRequest req) {
  ScopedFsIds as(req.as.uid, req.as.gid);
  const std::string& path = req.path;
  auto [parent, name] = SplitParent(path);
  if (name.empty()) return InvalidArgument("\"" + path + "\" names a directory");
  if (req.mkdirs) DSEC_RETURN_IF_ERROR(MakeDirs(parent, 0755).status());
  int flags = O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY | (req.append ? O_APPEND : O_TRUNC);
  // setuid/setgid bits are never granted through the API.
  mode_t m = static_cast<mode_t>(req.mode) & 01777;
  StatusOr<UniqueFd> opened = Resolve(path, flags, m);
  // ENXIO: a FIFO without a reader (O_NONBLOCK), or a device or socket.
  if (!opened.ok() && opened.status().error_number() == ENXIO)
    return InvalidArgument("\"" + path + "\" is not a regular file");
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, std::move(opened));
  struct stat st;
  if (fstat(fd.get(), &st) < 0) return ErrnoError("stat \"" + path + "\"");
  if (!S_ISREG(st.st_mode)) return InvalidArgument("\"" + path + "\" is not a regular file");
  DSEC_RETURN_IF_ERROR(RefuseKernelFs(fd.get(), path));
  fcntl(fd.get(), F_SETFL, req.append ? O_APPEND : 0);
  return Reply(std::make_unique<WriteFileOp>(agent, ch, std::move(fd), path, m, req.as));
}

StatusOr<Reply> HandleListDir(Agent*, uint32_t, protocol::ListDirRequest req) {
  ScopedFsIds as(req.as.uid, req.as.gid);
  const std::string& path = req.path;
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, Resolve(path, O_RDONLY | O_DIRECTORY));
  DSEC_RETURN_IF_ERROR(RefuseKernelFs(fd.get(), path));
  DIR* d = fdopendir(fd.Release());
  if (!d) return ErrnoError("opendir \"" + path + "\"");
  protocol::ListDirResponse out;
  size_t bytes = 0;  // the response must fit in one frame
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    bytes += n.size() * 6 + 96;  // worst-case JSON escaping plus the other fields
    if (out.entries.size() >= req.max_entries || bytes > protocol::kMaxPayload / 2) {
      out.truncated = true;
      break;
    }
    struct stat st;
    if (fstatat(dirfd(d), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
    out.entries.push_back(EntryFromStat(n, st));
  }
  closedir(d);
  return Reply(protocol::Encode(out));
}

namespace {

// The machine's memory (/proc/meminfo) and the processes in the agent's user cgroup: a
// microVM guest's own account of itself, for its stats.
void MachineInfo(Agent* agent, protocol::StatResponse* out) {
  if (auto m = ReadFileToString("/proc/meminfo", 16 << 10); m.ok()) {
    auto kb = [&](std::string_view key) -> uint64_t {
      size_t at = m->find(key);
      return at == std::string::npos ? 0 : strtoull(m->c_str() + at + key.size(), nullptr, 10);
    };
    out->mem_total = kb("MemTotal:") << 10;
    out->mem_available = kb("MemAvailable:") << 10;
  }
  if (const UniqueFd& cg = agent->config().cgroup_user; cg) {
    UniqueFd f(openat(cg.get(), "pids.current", O_RDONLY | O_CLOEXEC));
    char buf[32] = {};
    if (f && read(f.get(), buf, sizeof buf - 1) > 0) out->user_pids = strtoull(buf, nullptr, 10);
  }
}

}  // namespace

StatusOr<Reply> HandleStat(Agent* agent, uint32_t, protocol::StatRequest req) {
  ScopedFsIds as(req.as.uid, req.as.gid);
  DSEC_ASSIGN_OR_RETURN(UniqueFd fd, Resolve(req.path, O_PATH | O_NOFOLLOW));
  struct stat st;
  if (fstat(fd.get(), &st) < 0) return ErrnoError("stat \"" + req.path + "\"");
  protocol::StatResponse out{EntryFromStat(SplitParent(req.path).second, st), st.st_uid, st.st_gid};
  struct statvfs fs;
  if (fstatvfs(fd.get(), &fs) == 0) {
    out.fs_bytes = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
    out.fs_used = static_cast<uint64_t>(fs.f_blocks - fs.f_bfree) * fs.f_frsize;
  }
  if (req.machine) MachineInfo(agent, &out);
  return Reply(protocol::Encode(out));
}

StatusOr<Reply> HandleMakeDir(Agent*, uint32_t, protocol::MakeDirRequest req) {
  ScopedFsIds as(req.as.uid, req.as.gid);
  const std::string& path = req.path;
  mode_t mode = req.mode & 01777;  // setuid/setgid bits are never granted through the API
  if (req.parents) {
    DSEC_RETURN_IF_ERROR(MakeDirs(path, mode).status());
  } else {
    auto [parent, name] = SplitParent(path);
    DSEC_ASSIGN_OR_RETURN(UniqueFd pfd, Resolve(parent, O_PATH | O_DIRECTORY));
    if (mkdirat(pfd.get(), name.c_str(), mode) < 0) return ErrnoError("mkdir \"" + path + "\"");
  }
  return Reply(protocol::Encode(protocol::OkResponse{}));
}

StatusOr<Reply> HandleRemove(Agent*, uint32_t, protocol::RemoveRequest req) {
  ScopedFsIds as(req.as.uid, req.as.gid);
  const std::string& path = req.path;
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  auto [parent, name] = SplitParent(trimmed);
  if (name.empty()) return InvalidArgument("refusing to remove \"/\"");
  // "x/.." names x's parent (and "/.." the root): the name to unlink would be ".." itself,
  // and a recursive remove would empty a directory other than the one named.
  if (name == "." || name == "..")
    return InvalidArgument("\"" + path + "\" must not end in \".\" or \"..\"");
  DSEC_ASSIGN_OR_RETURN(UniqueFd pfd, Resolve(parent, O_RDONLY | O_DIRECTORY));
  DSEC_RETURN_IF_ERROR(RefuseKernelFs(pfd.get(), path));
  struct stat st;
  if (fstatat(pfd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0)
    return ErrnoError("stat \"" + path + "\"");
  if (S_ISDIR(st.st_mode) && !req.recursive) {
    if (unlinkat(pfd.get(), name.c_str(), AT_REMOVEDIR) < 0)
      return ErrnoError("rmdir \"" + path + "\"");
  } else {
    struct stat pst;
    if (fstat(pfd.get(), &pst) < 0) return ErrnoError("stat \"" + parent + "\"");
    DSEC_RETURN_IF_ERROR(
        RemoveTreeAt(pfd.get(), name, S_ISDIR(st.st_mode) ? st.st_dev : pst.st_dev, path));
  }
  return Reply(protocol::Encode(protocol::OkResponse{}));
}

StatusOr<Reply> HandleTarExtract(Agent* agent, uint32_t ch, protocol::TarExtractRequest req) {
  ScopedFsIds as(req.as.uid, req.as.gid);
  const std::string& path = req.path;
  std::vector<std::string> made;
  DSEC_ASSIGN_OR_RETURN(UniqueFd pathfd, MakeDirs(path, 0755, &made));
  DSEC_ASSIGN_OR_RETURN(UniqueFd dir, Resolve(path, O_RDONLY | O_DIRECTORY));
  DSEC_RETURN_IF_ERROR(RefuseKernelFs(dir.get(), path));
  return Reply(std::make_unique<TarExtractOp>(agent, ch, std::move(dir), req.as, req.max_bytes,
                                              std::move(made)));
}

StatusOr<Reply> HandleTarCreate(Agent* agent, uint32_t ch, protocol::TarCreateRequest req) {
  ScopedFsIds as(req.as.uid, req.as.gid);
  const std::string& path = req.path;
  // Archives larger than kMaxArchiveBytes are refused even when the caller names no smaller
  // bound (0).
  uint64_t max = req.max_bytes == 0 ? kMaxArchiveBytes : std::min(req.max_bytes, kMaxArchiveBytes);
  DSEC_ASSIGN_OR_RETURN(UniqueFd dir, Resolve(path, O_RDONLY | O_DIRECTORY));
  DSEC_RETURN_IF_ERROR(RefuseKernelFs(dir.get(), path));
  DSEC_ASSIGN_OR_RETURN(auto creator, archive::TarCreator::Open(dir.get(), "."));
  return Reply(std::make_unique<TarCreateOp>(agent, ch, std::move(creator), req.as, path, max));
}

StatusOr<Reply> HandleWatchDir(Agent* agent, uint32_t ch, protocol::WatchDirRequest req) {
  return Reply(std::make_unique<WatchOp>(agent, ch, std::move(req)));
}

}  // namespace dsec::agent
