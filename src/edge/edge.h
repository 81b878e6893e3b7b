// dsec-edge, assembled: state dir lock, tokens, state DB, audit log, container backend,
// manager (with re-adoption), API and HTTP server; then it serves until SIGTERM/SIGINT and
// shuts down cleanly (or leaves sandboxes for the next edge with --persist).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "edge/config.h"
#include "http/auth.h"

namespace dsec::edge {

using http::LoadOrCreateTokens;

// Runs the daemon in the calling thread until a termination signal. The caller must have
// blocked SIGTERM, SIGINT and SIGHUP in every thread (main does, before any thread starts).
// Returns the process exit code.
int RunEdge(EdgeConfig cfg);

}  // namespace dsec::edge
