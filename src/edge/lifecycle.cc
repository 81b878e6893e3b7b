#include "edge/lifecycle.h"

namespace dsec::edge {

namespace {
// "sandbox X failed and cannot be <this>".
std::string_view Participle(Op op) {
  switch (op) {
    case Op::kUse:
      return "used";
    case Op::kPause:
      return "paused";
    case Op::kResume:
      return "resumed";
    case Op::kSnapshot:
      return "snapshotted";
    case Op::kUpdate:
      return "updated";
  }
  return "used";
}
}  // namespace

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kUse:
      return "use";
    case Op::kPause:
      return "pause";
    case Op::kResume:
      return "resume";
    case Op::kSnapshot:
      return "snapshot";
    case Op::kUpdate:
      return "update";
  }
  return "unknown";
}

Status CheckOp(Op op, Phase phase, const std::string& id, const std::string& reason) {
  switch (phase) {
    case Phase::kRunning:
    case Phase::kPaused:
      return OkStatus();
    case Phase::kCreating:
      if (op == Op::kUpdate) return OkStatus();
      return Unavailable("sandbox " + id + " is still being created");
    case Phase::kFailed:
      if (op == Op::kUpdate) return OkStatus();
      return FailedPrecondition(
          "sandbox " + id + " failed" + (reason.empty() ? std::string() : " (" + reason + ")") +
          " and cannot be " + std::string(Participle(op)) + " any more; delete it");
    case Phase::kDeleted:
      return NotFound("sandbox " + id + " was deleted");
  }
  return InternalError("sandbox " + id + ": unknown phase");
}

}  // namespace dsec::edge
