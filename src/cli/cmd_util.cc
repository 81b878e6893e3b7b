#include "cli/cmd_util.h"

#include <algorithm>
#include <chrono>
#include <iostream>

#include "base/base64.h"
#include "base/strings.h"

namespace dsec::cli {

int Fail(const Status& s, int code) {
  std::string m = s.message();
  for (char& c : m)
    if (c == '\n') c = ' ';
  std::cerr << "dsec: " << m << "\n";
  return code;
}

StatusOr<std::unique_ptr<EdgeClient>> Connect(const GlobalOptions& g) {
  DSEC_ASSIGN_OR_RETURN(Endpoint ep, ResolveEndpoint(g.url, g.token, g.project));
  return std::make_unique<EdgeClient>(std::move(ep));
}

void PrintJson(const Json& j) {
  std::cout << j.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
}

void PrintTable(const std::vector<std::string>& head,
                const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(head.size());
  for (size_t i = 0; i < head.size(); ++i) w[i] = head[i].size();
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  auto line = [&](const std::vector<std::string>& r) {
    std::string out;
    for (size_t i = 0; i < r.size(); ++i) {
      out += r[i];
      if (i + 1 < r.size()) out += std::string(w[i] - r[i].size() + 2, ' ');
    }
    std::cout << out << "\n";
  };
  line(head);
  for (const auto& r : rows) line(r);
}

std::string Num(const Json& j) {
  if (j.is_number_integer()) return std::to_string(j.get<int64_t>());
  if (j.is_number()) return FormatNumber(j.get<double>());
  return j.is_string() ? j.get<std::string>() : j.dump();
}

std::string StatText(std::string_view key, const Json& v) {
  auto ends = [&](std::string_view suffix) {
    return key.size() >= suffix.size() && key.substr(key.size() - suffix.size()) == suffix;
  };
  if (!v.is_number_unsigned()) return Num(v);
  uint64_t n = v.get<uint64_t>();
  if (key.rfind("memory_", 0) == 0 || key.rfind("disk_", 0) == 0 || ends("_bytes"))
    return HumanSize(n);
  if (ends("_us")) return FormatNumber(static_cast<double>(n) / 1e6) + " s";
  return Num(v);
}

std::string ImageText(const Json& image) {
  if (image.is_string()) return image.get<std::string>();
  if (!image.is_array()) return image.is_null() ? "" : image.dump();
  std::string out;
  for (const auto& i : image) out += (out.empty() ? "" : ",") + Num(i);
  return out;
}

std::string SbPath(const std::string& id) { return "/v1/sandboxes/" + UrlEncode(id, false); }

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string BaseName(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string Duration(int64_t ms) {
  if (ms < 0) ms = 0;
  int64_t s = ms / 1000;
  if (s < 120) return std::to_string(s) + "s";
  if (s < 7200) return std::to_string(s / 60) + "m";
  if (s < 172800) return std::to_string(s / 3600) + "h";
  return std::to_string(s / 86400) + "d";
}

std::string HumanSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(kUnits)) {
    v /= 1024;
    ++u;
  }
  char b[32];
  snprintf(b, sizeof b, v < 9.95 ? "%.1f %s" : "%.0f %s", v, kUnits[u]);
  return b;
}

bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

void PrintResultJson(Json result, const std::string& out, const std::string& err) {
  const bool text = ValidUtf8(out) && ValidUtf8(err);
  result["encoding"] = text ? "utf-8" : "base64";
  result["stdout"] = text ? out : Base64Encode(out);
  result["stderr"] = text ? err : Base64Encode(err);
  std::cout << result.dump() << "\n";
}

}  // namespace dsec::cli
