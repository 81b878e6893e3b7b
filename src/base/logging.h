// Logging: one library (spdlog), key=value fields in messages ("sandbox={} ms={}").
// Log once, at the boundary (API handler, CLI); library code returns Status instead.
// Not linked into the static agent, which reports over its channel.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace dsec::log {

// level: trace|debug|info|warn|error|off. Output goes to stderr.
void Init(std::string_view level);

}  // namespace dsec::log

// Debug lines are checked against the level at run time (`--log-level debug` works in release
// builds, where spdlog's compile-time SPDLOG_DEBUG is compiled out).
#define DSEC_LOG_DEBUG(...) \
  SPDLOG_LOGGER_CALL(spdlog::default_logger_raw(), spdlog::level::debug, __VA_ARGS__)
#define DSEC_LOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define DSEC_LOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define DSEC_LOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
