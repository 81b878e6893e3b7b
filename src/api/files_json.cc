#include "api/files_json.h"

namespace dsec::api {

StatusOr<std::string> CheckFilePath(std::string path) {
  if (!path.starts_with('/')) return InvalidArgument("\"path\" must be absolute");
  if (path.size() > 4096) return InvalidArgument("\"path\" is too long");
  return path;
}

StatusOr<uint32_t> ParseFileMode(const std::string* mode, uint32_t def) {
  if (!mode || mode->empty()) return def;
  if (mode->size() > 5) return InvalidArgument("\"mode\" must be octal, like 0644");
  uint32_t v = 0;
  for (char ch : *mode) {
    if (ch < '0' || ch > '7') return InvalidArgument("\"mode\" must be octal, like 0644");
    v = v * 8 + static_cast<uint32_t>(ch - '0');
  }
  if (v > 07777) return InvalidArgument("\"mode\" must be at most 07777");
  return v;
}

Json FileEntryJson(const backends::FileEntry& e) {
  return {{"name", e.name},
          {"type", e.type},
          {"size", e.size},
          {"mode", e.mode & 07777},
          {"mtime", e.mtime_ms}};
}

Json EntriesJson(const std::vector<backends::FileEntry>& entries) {
  Json list = Json::array();
  for (const auto& e : entries) list.push_back(FileEntryJson(e));
  return Json{{"entries", list}};
}

}  // namespace dsec::api
