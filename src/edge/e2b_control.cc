// The E2B-compatible API's control plane (e2b.h): create, list, get, kill, pause, resume,
// timeouts of sandboxes.
#include <algorithm>
#include <boost/asio/post.hpp>
#include <cmath>

#include "base/logging.h"
#include "base/strings.h"
#include "edge/api.h"
#include "edge/e2b.h"
#include "edge/e2b_internal.h"
#include "edge/idempotency.h"

namespace dsec::edge {

namespace e2b = api::e2b;
using namespace e2b_detail;  // NOLINT(google-build-using-namespace)

// ---- control plane --------------------------------------------------------------------------

Json E2b::SandboxJson(const SandboxRecord& r, bool detail) const {
  Json meta = Json::object();
  for (const auto& [k, v] : r.labels)
    if (k != kCompatLabel && k != kTemplateLabel) meta[k] = v;
  auto t = r.labels.find(kTemplateLabel);
  std::string tmpl = t != r.labels.end() ? t->second : r.image;
  Json j = {{"sandboxID", r.id},
            {"templateID", tmpl},
            {"alias", tmpl},
            {"clientID", "dsec"},
            {"cpuCount", std::max<int64_t>(1, static_cast<int64_t>(std::ceil(r.limits.cpu)))},
            {"memoryMB", r.limits.memory_mb},
            {"diskSizeMB", r.limits.disk_mb},
            {"startedAt", e2b::Rfc3339(r.created_at)},
            // No TTL: E2B has no such state; its longest (24 h) from now.
            {"endAt", e2b::Rfc3339(r.expires_at > 0 ? r.expires_at : WallMs() + 86400000)},
            {"state", r.state == Phase::kPaused ? "paused" : "running"},
            {"envdVersion", e2b::kEnvdVersion},
            {"metadata", meta},
            {"volumeMounts", Json::array()}};
  if (detail) {
    j["envdAccessToken"] = AccessToken(r.id);
    j["trafficAccessToken"] = TrafficToken(r.id);
    j["domain"] = nullptr;
  }
  return j;
}

void E2b::ControlPlane(http::HttpRequest& req, const Res& res) {
  auto send = [&](http::HttpResponse r) {
    d_.metrics->CountRequest(req.method, r.status);
    res->Send(std::move(r));
  };
  std::vector<std::string> seg;
  for (auto s : SplitString(req.path, '/', true)) seg.emplace_back(s);
  const std::string& m = req.method;
  const bool v2 = !seg.empty() && seg[0] == "v2";
  if (v2) seg.erase(seg.begin());
  if (seg.empty() || seg[0] != "sandboxes")
    return send(JsonResponse(404, e2b::ApiError(404, "no route " + m + " " + req.path)));
  if (seg.size() == 1) {
    if (m == "POST") return Create(req, res);
    if (m == "GET") return List(req, res);
    return send(JsonResponse(405, e2b::ApiError(405, "GET or POST")));
  }
  const std::string& id = seg[1];
  if (Status s = api::ValidateId("sandbox id", id); !s.ok()) return send(ApiFail(s));
  Manager& mgr = *d_.manager;
  auto json_body = [&]() -> StatusOr<Json> {
    if (req.body.empty()) return Json::object();
    auto j = ParseJson(req.body);
    if (!j.ok() || !j->is_object()) return InvalidArgument("the body must be a JSON object");
    return std::move(*j);
  };
  if (seg.size() == 2 && m == "GET") {
    auto e = mgr.Get(id);
    if (!e.ok()) return send(ApiFail(e.status()));
    return send(JsonResponse(200, Dump(SandboxJson(mgr.Record(**e), true))));
  }
  if (seg.size() == 2 && m == "DELETE") {
    if (Status s = mgr.Delete(id, "api"); !s.ok()) return send(ApiFail(s));
    return send(NoContent());
  }
  if (seg.size() == 3 && m == "POST" && seg[2] == "timeout") {
    auto b = json_body();
    if (!b.ok()) return send(ApiFail(b.status()));
    auto t = GetInt(*b, "timeout", std::nullopt, 0, kMaxTimeoutS);
    if (!t.ok()) return send(ApiFail(t.status()));
    PatchParams pp;
    pp.ttl_s = std::max<int64_t>(1, *t);
    if (auto r = mgr.Patch(id, pp); !r.ok()) return send(ApiFail(r.status()));
    return send(NoContent());
  }
  if (seg.size() == 3 && m == "POST" && seg[2] == "pause") {
    auto e = mgr.Get(id);
    if (!e.ok()) return send(ApiFail(e.status()));
    if ((*e)->phase() == Phase::kPaused)
      return send(JsonResponse(409, e2b::ApiError(409, "sandbox " + id + " is already paused")));
    if (auto r = mgr.Pause(id); !r.ok()) return send(ApiFail(r.status()));
    return send(NoContent());
  }
  if (seg.size() == 3 && m == "POST" && (seg[2] == "connect" || seg[2] == "resume")) {
    auto b = json_body();
    if (!b.ok()) return send(ApiFail(b.status()));
    auto t = GetInt(*b, "timeout", int64_t{0}, 0, kMaxTimeoutS);
    if (!t.ok()) return send(ApiFail(t.status()));
    auto e = mgr.Get(id);
    if (!e.ok()) return send(ApiFail(e.status()));
    bool resumed = false;
    if ((*e)->phase() == Phase::kPaused) {
      if (auto r = mgr.Resume(id); !r.ok()) return send(ApiFail(r.status()));
      resumed = true;
    }
    SandboxRecord rec = mgr.Record(**e);
    // The timeout only extends a running sandbox's life (as E2B's connect does).
    int64_t want_s = *t > 0 ? *t : kDefaultTimeoutS;
    if (resumed || rec.expires_at < WallMs() + want_s * 1000) {
      PatchParams pp;
      pp.ttl_s = want_s;
      auto r = mgr.Patch(id, pp);
      if (!r.ok()) return send(ApiFail(r.status()));
      rec = *r;
    }
    return send(JsonResponse(resumed ? 201 : 200, Dump(SandboxJson(rec, true))));
  }
  send(JsonResponse(404, e2b::ApiError(404, "no route " + m + " " + req.path)));
}

void E2b::Create(const http::HttpRequest& req, const Res& res) {
  auto fail = [&](const Status& s) {
    http::HttpResponse r = ApiFail(s);
    d_.metrics->CountRequest(req.method, r.status);
    res->Send(std::move(r));
  };
  auto body = ParseJson(req.body.empty() ? std::string_view("{}") : std::string_view(req.body));
  if (!body.ok() || !body->is_object())
    return fail(InvalidArgument("the body must be a JSON object"));
  const Json& b = *body;
  auto tmpl = GetString(b, "templateID", std::string("base"));
  if (!tmpl.ok()) return fail(tmpl.status());
  auto timeout = GetInt(b, "timeout", kDefaultTimeoutS, 1, kMaxTimeoutS);
  if (!timeout.ok()) return fail(timeout.status());
  auto meta = GetStringMap(b, "metadata");
  if (!meta.ok()) return fail(meta.status());
  auto envs = GetStringMap(b, "envVars");
  if (!envs.ok()) return fail(envs.status());
  CreateParams p;
  p.resources = d_.cfg->defaults;
  p.ttl_s = *timeout;
  p.image = *tmpl == "base" || *tmpl == "code-interpreter-v1" ? "host" : *tmpl;
  p.workdir = kHome;
  // envVars as the REST API takes env: at most 256, names without '=' or NUL, values no NUL.
  if (envs->size() > 256) return fail(InvalidArgument("envVars: at most 256 variables"));
  for (const auto& [k, v] : *envs)
    if (k.empty() || k.size() > 256 || v.size() > (32 << 10) ||
        k.find_first_of(std::string("=\0", 2)) != std::string::npos ||
        v.find('\0') != std::string::npos)
      return fail(
          InvalidArgument("envVars: names of 1-256 bytes without '=' or NUL, values of "
                          "at most 32 KiB without NUL"));
  p.env = *envs;
  p.env["HOME"] = kHome;
  for (const auto& [k, v] : *meta) {
    bool ok = !k.empty() && k.size() <= 63 && v.size() <= 256;
    for (char c : k)
      ok = ok &&
           (isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == '/');
    if (!ok)
      return fail(InvalidArgument("metadata \"" + k +
                                  "\": keys are 1-63 characters of A-Z a-z 0-9 . _ - / and "
                                  "values at most 256 bytes (they are the sandbox's labels)"));
    p.labels[k] = v;
  }
  if (p.labels.size() > 62) return fail(InvalidArgument("at most 62 metadata entries"));
  p.labels[kCompatLabel] = "e2b";
  p.labels[kTemplateLabel] = *tmpl;
  if (auto net = b.find("allow_internet_access");
      net != b.end() && net->is_boolean() && net->get<bool>()) {
    if (!d_.cfg->network)
      return fail(InvalidArgument(
          "allow_internet_access: this node runs without sandbox networking (network: false)"));
    p.network.mode = net::NetMode::kOpen;
  }
  auto* workers = d_.workers;
  auto made = d_.manager->Create(p, 1, /*wait=*/true, [workers](std::function<void()> task) {
    boost::asio::post(*workers, std::move(task));
  });
  if (!made.ok()) return fail(made.status());
  d_.metrics->CountRequest(req.method, 201);
  res->Send(JsonResponse(201, Dump(SandboxJson(made->front(), true))));
}

void E2b::List(const http::HttpRequest& req, const Res& res) {
  auto fail = [&](const Status& s) {
    http::HttpResponse r = ApiFail(s);
    d_.metrics->CountRequest(req.method, r.status);
    res->Send(std::move(r));
  };
  ListFilter f;
  f.labels.emplace_back(kCompatLabel, "e2b");
  if (const std::string* m = req.Query("metadata")) {
    auto filter = e2b::ParseMetadataFilter(*m);
    if (!filter.ok()) return fail(filter.status());
    for (const auto& kv : *filter) f.labels.push_back(kv);
  }
  bool want_running = true, want_paused = true;
  if (const std::string* st = req.Query("state")) {
    want_running = want_paused = false;
    for (auto s : SplitString(*st, ',', true)) {
      if (s == "running") {
        want_running = true;
      } else if (s == "paused") {
        want_paused = true;
      } else {
        return fail(InvalidArgument("state must be running and/or paused"));
      }
    }
  }
  if (want_running != want_paused) f.state = want_running ? Phase::kRunning : Phase::kPaused;
  int64_t limit = 100;
  if (const std::string* l = req.Query("limit")) {
    auto v = ParseInt64(*l);
    if (!v || *v < 1 || *v > 100) return fail(InvalidArgument("limit must be 1-100"));
    limit = *v;
  }
  f.limit = static_cast<size_t>(limit);
  if (const std::string* t = req.Query("nextToken")) f.cursor = *t;
  auto page = d_.manager->List(f);
  if (!page.ok()) return fail(page.status());
  Json out = Json::array();
  for (const auto& r : page->sandboxes)
    if (r.state == Phase::kRunning || r.state == Phase::kPaused)
      out.push_back(SandboxJson(r, false));
  http::HttpResponse r = JsonResponse(200, Dump(out));
  if (!page->next_cursor.empty()) r.headers.emplace_back("X-Next-Token", page->next_cursor);
  d_.metrics->CountRequest(req.method, 200);
  res->Send(std::move(r));
}

}  // namespace dsec::edge
