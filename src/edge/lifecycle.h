// One state machine per sandbox, owned by the manager (SandboxEntry::phase_):
//
//   creating --ready--> running <--pause/resume--> paused
//      |                   |  \____________________/  |
//      |                   +---- agent died ----------+--> failed
//      +--------- delete (any state) ----------------------> deleted
//
// The backend's Sandbox keeps its own state for its own checks; the manager's phase is what
// the API shows, fed by the manager's own transitions and by the backend's failure events.
// CheckOp is the transition table: whether an operation may run in a phase, and the answer
// (409, 404 or 503) when it may not.
#pragma once

#include <string>
#include <string_view>

#include "api/records.h"
#include "base/status.h"

namespace dsec::edge {

using api::Phase;
using api::PhaseName;

enum class Op {
  kUse,       // exec, shells, files, archives, stats, attach: resumes a paused sandbox first
  kPause,     // a no-op when paused
  kResume,    // a no-op when running
  kSnapshot,  // snapshot and fork: a paused sandbox stays paused
  kUpdate,    // TTLs and labels: any live state
};
std::string_view OpName(Op op);

// OK when `op` may run on a sandbox in `phase`; otherwise the error to answer with: 404 once it
// was deleted, 409 (FailedPrecondition) when it failed (with `reason`), 503 (Unavailable) while
// it is still being created and the caller will not wait.
Status CheckOp(Op op, Phase phase, const std::string& id, const std::string& reason = "");

}  // namespace dsec::edge
