// Image routes (issue 5): list, inspect, delete and import images; snapshot a sandbox into an
// image; fork a sandbox into N new ones from its current files.
#include <unistd.h>

#include <boost/asio/post.hpp>

#include "api/images_json.h"
#include "api/sandboxes_json.h"
#include "base/strings.h"
#include "edge/api.h"
#include "edge/builds.h"
#include "edge/cluster_images.h"
#include "images/import.h"
#include "images/store.h"

namespace dsec::edge {

namespace {

// An image's record as the API shows it (api/images_json.h), with what the store knows of it.
api::ImageRecord ImageRecordOf(images::ImageStore* store, const images::Image& img) {
  api::ImageRecord r;
  for (const auto& d : img.layers) {
    auto l = store->GetLayer(d);
    r.layers.push_back(
        {d, l.ok() ? l->size : 0,
         std::string(images::LayerFormatName(l.ok() ? l->format : images::LayerFormat::kDir))});
  }
  r.name = img.name;
  r.base = img.base;
  r.env = img.config.env;
  r.workdir = img.config.workdir;
  r.user = img.config.user;
  r.entrypoint = img.config.entrypoint;
  r.cmd = img.config.cmd;
  r.size = store->ImageSize(img);
  r.source = img.source;
  r.created_at = img.created_at;
  r.in_use = store->InUse(img);
  return r;
}

Json ImageJson(images::ImageStore* store, const images::Image& img) {
  return api::ToJson(ImageRecordOf(store, img));
}

using api::HostImageJson;

StatusOr<images::ImageStore*> Store(const std::shared_ptr<Ctx>& c) {
  images::ImageStore* s = c->api->deps().images;
  if (!s) return FailedPrecondition("this node has no image store");
  return s;
}

void ListImages(const std::shared_ptr<Ctx>& c) {
  std::vector<api::ImageRecord> imgs;
  if (images::ImageStore* s = c->api->deps().images)
    for (const auto& img : s->ListImages()) imgs.push_back(ImageRecordOf(s, img));
  c->Reply(200, api::ImageListJson(imgs));
}

void GetImage(const std::shared_ptr<Ctx>& c) {
  const std::string& name = c->params["name"];
  if (name == "host" || name == "host:latest") return c->Reply(200, HostImageJson());
  auto s = Store(c);
  if (!s.ok()) return c->Fail(s.status());
  auto img = (*s)->GetImage(name);
  if (!img.ok()) return c->Fail(img.status());
  c->Reply(200, ImageJson(*s, *img));
}

void DeleteImage(const std::shared_ptr<Ctx>& c) {
  const std::string& name = c->params["name"];
  if (name == "host" || name == "host:latest")
    return c->Fail(409, "conflict", "\"host\" is the built-in image and cannot be deleted");
  auto s = Store(c);
  if (!s.ok()) return c->Fail(s.status());
  // A pool keeps making sandboxes of its image: it goes first. The node's own standby pools
  // (config microvm_standby) go with the image.
  if (auto norm = images::NormalizeName(name); norm.ok() && c->api->deps().pools) {
    pools::PoolSet& set = *c->api->deps().pools;
    set.RemoveNow([&](const pools::PoolConfig& p) {
      if (p.expire_unused_s <= 0) return false;
      for (auto n : SplitString(p.image, ',', /*skip_empty=*/true))
        if (n == *norm) return true;
      return false;
    });
    for (const auto& p : set.List())
      if (p.config.image == *norm)
        return c->Fail(409, "conflict",
                       "image \"" + *norm + "\" is the image of pool \"" + p.config.name +
                           "\"; delete the pool or give it another image first");
  }
  if (Status st = (*s)->DeleteImage(name); !st.ok()) return c->Fail(st);
  // Its layers go now unless another image or a sandbox still uses them.
  (void)(*s)->Collect();
  c->NoContent();
}

void ImportImage(const std::shared_ptr<Ctx>& c) {
  auto s = Store(c);
  if (!s.ok()) return c->Fail(s.status());
  auto name = c->RequiredQuery("name");
  if (!name.ok()) return c->Fail(name.status());
  images::ImportOptions o;
  o.name = *name;
  if (const std::string* f = c->req.Query("format"); f && !f->empty()) o.format = *f;
  if (const std::string* f = c->req.Query("layer_format"); f && !f->empty()) {
    auto format = images::ParseLayerFormat(*f);
    if (!format.ok()) return c->Fail(format.status());
    o.layer_format = *format;
  }
  if (const std::string* b = c->req.Query("base"); b && !b->empty()) o.base = *b;
  o.max_archive_bytes = c->api->deps().cfg.max_import_bytes;
  // In a cluster: the project's image (the one the apiserver names), under the cluster's name.
  ClusterImages* cluster = c->api->deps().cluster_images;
  std::string project = c->req.Header("dsec-project");
  if (project.empty()) project = "default";
  if (cluster) {
    o.project = project;
    auto norm = images::NormalizeName(*name);
    if (!norm.ok()) return c->Fail(norm.status());
    if (Status st = cluster->CheckName(*norm, project); !st.ok()) return c->Fail(st);
  }
  auto imp = images::Importer::Start(*s, o);
  if (!imp.ok()) return c->Fail(imp.status());
  Status st;
  if (c->req.body_file) {
    // Spooled to disk by the HTTP layer: an uncompressed archive is imported from that file
    // as it is (not written again), a compressed one decompressed from it.
    st = (*imp)->FeedFile(c->req.body_file.get(), c->req.body_size);
    c->req.body_file.Reset();  // the importer holds its own descriptor of it if it needs one
  } else {
    std::string_view body = c->req.body;
    while (st.ok() && !body.empty()) {
      size_t n = std::min<size_t>(body.size(), 1 << 20);
      st = (*imp)->Feed(body.substr(0, n));
      body.remove_prefix(n);
    }
  }
  StatusOr<images::Image> img = st.ok() ? (*imp)->Finish() : StatusOr<images::Image>(st);
  imp->reset();
  if (!img.ok()) {
    Status e = img.status();
    // A bad archive is the caller's: 400 unless it is too large (413) or the node failed.
    if (e.code() == StatusCode::kFailedPrecondition || e.code() == StatusCode::kInternal ||
        e.code() == StatusCode::kAlreadyExists || e.code() == StatusCode::kTooLarge ||
        e.code() == StatusCode::kResourceExhausted)
      return c->Fail(e);
    return c->Fail(400, "bad_request", e.message());
  }
  if (cluster) {
    if (Status st = cluster->Publish(*img); !st.ok()) return c->Fail(st);
  }
  c->Reply(201, ImageJson(*s, *img));
}

// "image" of the sandbox as the list of names it was made from.
std::vector<std::string> StackNames(const std::string& image) {
  std::vector<std::string> out;
  for (auto n : SplitString(image, ',', /*skip_empty=*/true)) out.emplace_back(n);
  return out;
}

void Snapshot(const std::shared_ptr<Ctx>& c) {
  auto s = Store(c);
  if (!s.ok()) return c->Fail(s.status());
  auto req = api::ParseSnapshotRequest(c->req.body);
  if (!req.ok()) return c->Fail(req.status());
  auto norm = images::NormalizeName(req->image);
  if (!norm.ok()) return c->Fail(norm.status());
  if ((*s)->GetImage(*norm).ok())  // checked again when it is added
    return c->Fail(409, "conflict", "image \"" + *norm + "\" already exists");
  // In a cluster, the sandbox's project's image under the cluster's name.
  ClusterImages* cluster = c->api->deps().cluster_images;
  std::shared_ptr<SandboxEntry> e;
  auto sb = c->Sandbox(&e, Op::kSnapshot);
  if (!sb.ok()) return c->Fail(sb.status());
  if (cluster) {
    if (Status st = cluster->CheckName(*norm, e->params.project); !st.ok()) return c->Fail(st);
  }
  if (auto caps = c->api->deps().manager->Capabilities(e->params.kind); !caps.ok())
    return c->Fail(caps.status());
  else if (!caps->snapshot)
    return c->Fail(backends::NoSnapshot(e->params.kind));
  images::ImageStore::Lease lease(*s);  // the new layer is unreferenced until PutImage
  auto stack = (*sb)->CaptureStack(req->keep_setuid);
  if (!stack.ok()) return c->Fail(stack.status());
  images::Image img;
  img.name = *norm;
  img.source = "snapshot";
  // Its sandbox's project's alone (a create in another project finds no such image).
  img.project = e->params.project;
  for (const auto& n : *stack) {
    if (n == "host")
      img.base = "host";
    else
      img.layers.push_back(n);
  }
  // The config of what it was made from (if those images still exist); for a fork, of what
  // its source was made from.
  const std::string& from_names =
      e->params.config_from.empty() ? e->params.image : e->params.config_from;
  if (auto from = (*s)->Acquire(StackNames(from_names), ""); from.ok()) img.config = from->config;
  if (Status st = (*s)->PutImage(img); !st.ok()) return c->Fail(st);
  auto stored = (*s)->GetImage(img.name);
  if (!stored.ok()) return c->Fail(stored.status());
  if (cluster) {
    if (Status st = cluster->Publish(*stored); !st.ok()) return c->Fail(st);
  }
  c->Reply(201, ImageJson(*s, *stored));
}

void Fork(const std::shared_ptr<Ctx>& c) {
  auto s = Store(c);
  if (!s.ok()) return c->Fail(s.status());
  auto req = api::ParseForkRequest(c->req.body, std::min(64, c->api->deps().cfg.max_count));
  if (!req.ok()) return c->Fail(req.status());
  std::shared_ptr<SandboxEntry> e;
  auto sb = c->Sandbox(&e, Op::kSnapshot);
  if (!sb.ok()) return c->Fail(sb.status());
  auto caps = c->api->deps().manager->Capabilities(e->params.kind);
  if (!caps.ok()) return c->Fail(caps.status());
  if (!caps->snapshot) return c->Fail(backends::NoSnapshot(e->params.kind));
  if (req->memory && !caps->fork_memory)
    return c->Fail(Unimplemented(
        std::string(backends::KindName(e->params.kind)) +
        " sandboxes fork their files only (processes start fresh); memory: true forks a "
        "microVM's running machine"));
  CreateParams p = e->params;
  p.pool.clear();
  images::ImageStore::Lease lease(*s);  // until the forks hold the new layer
  if (req->memory) {
    // Its machine as it is now (files included: a microVM's writable layer is in its memory),
    // restored by each fork on the same image layers.
    auto machine = (*sb)->SaveMachine();
    if (!machine.ok()) return c->Fail(machine.status());
    p.machine = std::move(*machine);
  } else {
    auto stack = (*sb)->CaptureStack(req->keep_setuid);
    if (!stack.ok()) return c->Fail(stack.status());
    if (p.config_from.empty()) p.config_from = p.image;
    p.image = JoinStrings(*stack, ",");
  }
  auto* workers = c->api->deps().workers;
  auto made = c->api->deps().manager->Create(
      p, req->count, /*wait=*/true,
      [workers](std::function<void()> f) { boost::asio::post(*workers, std::move(f)); });
  if (!made.ok()) return c->Fail(made.status());
  c->Reply(201, api::SandboxListJson(*made));
}

// The build routes' common part: 409 when this node does not build images, else `fn`'s
// answer (a record, a list or a log piece, with `ok_status`) or its error.
template <typename Fn>
void WithBuilds(const std::shared_ptr<Ctx>& c, int ok_status, Fn&& fn) {
  Builds* b = c->api->deps().builds;
  if (!b || !c->api->deps().images)
    return c->Fail(FailedPrecondition("this node does not build images"));
  auto answer = fn(b);
  if (!answer.ok()) return c->Fail(answer.status());
  c->Reply(ok_status, api::ToJson(*answer));
}

void StartBuild(const std::shared_ptr<Ctx>& c) {
  WithBuilds(c, 202, [&](Builds* b) -> StatusOr<BuildRecord> {
    DSEC_ASSIGN_OR_RETURN(BuildRequest req, ParseBuildRequest(c->req.body));
    if (req.network.mode != net::NetMode::kNone && !c->api->deps().cfg.network)
      return Unimplemented(
          "a build's network is not available: this edge runs with network: false");
    const std::string project = c->req.Header("dsec-project");
    // In a cluster, the images it starts from may be on other nodes: fetched first.
    if (ClusterImages* cluster = c->api->deps().cluster_images)
      DSEC_RETURN_IF_ERROR(cluster->Ensure(project.empty() ? "default" : project, req.from));
    for (const auto& n : req.from)
      if (n != "host") DSEC_RETURN_IF_ERROR(c->api->deps().images->GetImage(n).status());
    return b->Start(std::move(req), project);
  });
}

void ListBuilds(const std::shared_ptr<Ctx>& c) {
  Builds* b = c->api->deps().builds;
  if (!b || !c->api->deps().images)
    return c->Fail(FailedPrecondition("this node does not build images"));
  auto list = [&]() -> StatusOr<std::vector<BuildRecord>> {
    std::string state;
    if (const std::string* s = c->req.Query("state")) {
      static const char* kStates[] = {"queued",    "running", "canceling",
                                      "succeeded", "failed",  "canceled"};
      if (std::find(std::begin(kStates), std::end(kStates), *s) == std::end(kStates))
        return InvalidArgument(
            "state must be queued, running, canceling, succeeded, failed or canceled");
      state = *s;
    }
    return b->List(state, c->req.Header("dsec-project"));
  }();
  if (!list.ok()) return c->Fail(list.status());
  c->Reply(200, api::BuildListJson(*list));
}

void GetBuild(const std::shared_ptr<Ctx>& c) {
  WithBuilds(c, 200,
             [&](Builds* b) { return b->Get(c->params["id"], c->req.Header("dsec-project")); });
}

void BuildLog(const std::shared_ptr<Ctx>& c) {
  WithBuilds(c, 200, [&](Builds* b) -> StatusOr<BuildLogPiece> {
    DSEC_ASSIGN_OR_RETURN(int64_t offset, c->IntQuery("offset", 0, 0, int64_t{1} << 62));
    DSEC_ASSIGN_OR_RETURN(int64_t max, c->IntQuery("max_bytes", 1 << 20, 1, 4 << 20));
    return b->Log(c->params["id"], static_cast<uint64_t>(offset), static_cast<uint64_t>(max),
                  c->req.Header("dsec-project"));
  });
}

void CancelBuild(const std::shared_ptr<Ctx>& c) {
  WithBuilds(c, 200,
             [&](Builds* b) { return b->Cancel(c->params["id"], c->req.Header("dsec-project")); });
}

}  // namespace

void RegisterImageRoutes(Api* a) {
  a->Bind(api::RouteId::kStartBuild, StartBuild);
  a->Bind(api::RouteId::kListBuilds, ListBuilds);
  a->Bind(api::RouteId::kGetBuild, GetBuild);
  a->Bind(api::RouteId::kBuildLog, BuildLog);
  a->Bind(api::RouteId::kCancelBuild, CancelBuild);
  a->Bind(api::RouteId::kListImages, ListImages);
  a->Bind(api::RouteId::kGetImage, GetImage);
  a->Bind(api::RouteId::kDeleteImage, DeleteImage);
  a->Bind(api::RouteId::kImportImage, ImportImage);
  a->Bind(api::RouteId::kSnapshot, Snapshot);
  a->Bind(api::RouteId::kFork, Fork);
}

}  // namespace dsec::edge
