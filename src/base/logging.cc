#include "base/logging.h"

#include <spdlog/sinks/stdout_sinks.h>

#include <string>

namespace dsec::log {

void Init(std::string_view level) {
  auto logger = spdlog::stderr_logger_mt("dsec");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  logger->set_level(spdlog::level::from_str(std::string(level)));
  spdlog::set_default_logger(logger);
}

}  // namespace dsec::log
