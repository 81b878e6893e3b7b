// Helpers shared by the CLI's edge commands (edge_cmds.cc, fncall_cmds.cc): the connection to
// the edge, one-line errors, and the JSON and table output.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "cli/edge_client.h"
#include "cli/run.h"

namespace dsec::cli {

inline constexpr int kFail = 1;        // a dsec error (bad input, API error)
inline constexpr int kExecFail = 125;  // exec/run/fn could not run the command at all

// Prints "dsec: <message>" as one line on stderr and returns code.
int Fail(const Status& s, int code = kFail);
StatusOr<std::unique_ptr<EdgeClient>> Connect(const GlobalOptions& g);
void PrintJson(const Json& j);
// Left-aligned columns, two spaces apart.
void PrintTable(const std::vector<std::string>& head,
                const std::vector<std::vector<std::string>>& rows);
// A JSON number (or string) as the tables show it.
std::string Num(const Json& j);
// A stats value for people: bytes (memory_*, disk_*, *_bytes) in KiB/MiB/GiB, *_us in seconds.
std::string StatText(std::string_view key, const Json& v);
// A sandbox record's "image": a name, or the stacked names joined by ",".
std::string ImageText(const Json& image);

std::string SbPath(const std::string& id);  // /v1/sandboxes/<id, escaped>
int64_t NowMs();                            // wall clock, ms since the epoch
std::string BaseName(std::string path);     // the last component; trailing slashes ignored
// An age or a time left, as the tables show it: "42s", "5m", "3h", "2d".
std::string Duration(int64_t ms);

// A byte count for people: "512 B", "3.1 KiB", "42 MiB".
std::string HumanSize(uint64_t bytes);

// Whether `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool ValidUtf8(std::string_view s);
// `--json` of a command's run: its result fields with "stdout" and "stderr" as text when both
// are UTF-8, else both in base64, and "encoding" saying which (as the API's results do); one
// line on stdout.
void PrintResultJson(Json result, const std::string& out, const std::string& err);

}  // namespace dsec::cli
