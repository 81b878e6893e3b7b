// libFuzzer target for the REST layer's request codecs (src/api): every parser a handler of the
// edge or the apiserver runs on a caller's body, fed the fuzzer's bytes. The first byte picks
// the parser, the rest is the body (or, for the multipart parser, a boundary line then the
// body). The HTTP layer before them (request parsing, preflight, routing) is the http target's
// (src/edge/http_fuzz.cc); this one reaches the codecs with bodies no HTTP framing constrains.
//
// Invariants checked (a violation traps): no parser throws; an accepted create asks for a
// count within its limit and a kind the node serves; an accepted exec has exactly one of cmd
// and shell, within the output limit; an accepted pool PUT names the pool of the path with
// min_idle <= max; every error is a status with a message; what a parser accepted renders
// back to JSON without throwing.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "api/builds_json.h"
#include "api/create_request.h"
#include "api/e2b.h"
#include "api/exec_json.h"
#include "api/fncall_json.h"
#include "api/images_json.h"
#include "api/network_json.h"
#include "api/pool_json.h"
#include "api/ports_json.h"
#include "api/sandbox_fusion.h"
#include "api/sandboxes_json.h"

namespace {

using namespace dsec;  // NOLINT: a fuzz entry point

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

template <class T>
void CheckError(const StatusOr<T>& r) {
  if (!r.ok()) Check(!r.status().message().empty());
}

void Fuzz(uint8_t which, std::string_view body) {
  switch (which % 16) {
    case 0: {
      api::CreateLimits limits{.max_count = 64,
                               .kinds = {backends::Kind::kContainer},
                               .network = true,
                               .check_kind = nullptr};
      auto r = api::ParseCreateRequest(body, limits);
      CheckError(r);
      if (r.ok()) {
        Check(!r->count || (*r->count >= 1 && *r->count <= 64));
        Check(!r->kind || *r->kind == backends::Kind::kContainer);
      }
      return;
    }
    case 1: {
      auto r = api::ParsePatchRequest(body, /*network=*/true);
      CheckError(r);
      return;
    }
    case 2: {
      auto r = api::ParseExecRequest(body, {.max_stdin_bytes = 1 << 16, .max_output_bytes = 4096});
      CheckError(r);
      if (r.ok()) {
        Check(r->req.cmd.empty() == r->req.shell.has_value());
        Check(r->req.max_output_bytes <= 4096 || r->req.max_output_bytes == 1 << 20);
      }
      return;
    }
    case 3:
      CheckError(api::ParseSignalRequest(body));
      CheckError(api::ParseOpenShellRequest(body));
      CheckError(api::ParseShellRunRequest(body, 4096));
      CheckError(api::ParseAttachControl(body));
      return;
    case 4: {
      auto r = api::ParseFnCallRequest(body, {.max_body_bytes = 1 << 16, .max_output_bytes = 4096});
      CheckError(r);
      return;
    }
    case 5: {
      auto defaults = [](pools::PoolKind kind) {
        pools::PoolConfig c;
        c.kind = kind;
        return c;
      };
      auto r = api::ParsePoolPut(body, "p1", nullptr, defaults);
      CheckError(r);
      if (r.ok()) {
        Check(r->name == "p1");
        Check(r->min_idle <= r->max);
        (void)api::ToJson(*r).dump();
      }
      CheckError(api::StoredPoolFromJson(body, "p1", defaults));
      return;
    }
    case 6:
      CheckError(api::ParseSnapshotRequest(body));
      CheckError(api::ParseForkRequest(body, 16));
      return;
    case 7:
      CheckError(api::ParseBuildRequest(body));
      CheckError(api::ParsePortUrlRequest(body));
      return;
    case 8: {
      auto r = api::ParseCreateShape(body);
      CheckError(r);
      return;
    }
    case 9: {
      api::fusion::RunCodeRequest rc;
      std::vector<api::fusion::FieldError> errors;
      if (!api::fusion::ParseRunCode(body, &rc, &errors)) {
        Check(!errors.empty());
        (void)api::fusion::RenderDetail(errors);
      }
      api::fusion::RunJupyterRequest rj;
      errors.clear();
      if (!api::fusion::ParseRunJupyter(body, &rj, &errors)) Check(!errors.empty());
      return;
    }
    case 10: {
      auto env = api::e2b::ParseRequestEnvelope(body);
      CheckError(env);
      if (env.ok()) {
        CheckError(api::e2b::ParseStartRequest(*env));
        CheckError(api::e2b::ParseSelector(*env));
      }
      CheckError(api::e2b::ParseMetadataFilter(body));
      return;
    }
    case 11: {
      // A boundary line, then the body.
      size_t nl = body.find('\n');
      std::string_view boundary = body.substr(0, nl);
      std::string_view rest = nl == std::string_view::npos ? "" : body.substr(nl + 1);
      std::string ct = "multipart/form-data; boundary=" + std::string(boundary);
      auto parts = api::e2b::ParseMultipart(ct, rest);
      CheckError(parts);
      if (parts.ok())
        for (const auto& p : *parts) Check(p.data.size() <= rest.size());
      return;
    }
    default: {
      Json j = Json::parse(body, nullptr, false);
      if (j.is_discarded()) return;
      CheckError(api::ParseImageStack(&j));
      if (j.is_object()) {
        auto net = api::NetworkPolicyFromJson(&j);
        CheckError(net);
        if (net.ok()) (void)api::ToJson(*net).dump();
      }
      return;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Fuzz(data[0], std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  return 0;
}
