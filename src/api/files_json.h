// Files as the REST API writes them (/v1/sandboxes/{id}/files...): the checks of the "path" and
// "mode" query parameters and the entries of list and stat, for the edge's file handlers
// (edge/api_files.cc). The agent resolves paths inside the sandbox root; these check shape only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/sandbox_types.h"
#include "base/json.h"
#include "base/status.h"

namespace dsec::api {

// A "path" query parameter: absolute, at most 4096 bytes.
StatusOr<std::string> CheckFilePath(std::string path);
// A "mode" query parameter (octal, at most 07777); `def` when absent or empty.
StatusOr<uint32_t> ParseFileMode(const std::string* mode, uint32_t def);

// A FileEntry of stat and list (not protocol::ToJson: the API shows the permission bits only).
Json FileEntryJson(const backends::FileEntry& e);
// The answer of a list: {"entries": [...]}.
Json EntriesJson(const std::vector<backends::FileEntry>& entries);

}  // namespace dsec::api
