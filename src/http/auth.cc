#include "http/auth.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file_util.h"
#include "base/ids.h"
#include "base/logging.h"
#include "base/strings.h"
#include "base/unique_fd.h"

namespace dsec::http {

StatusOr<std::vector<std::string>> LoadOrCreateTokens(const std::string& path) {
  if (access(path.c_str(), F_OK) != 0) {
    std::string dir = path.substr(0, path.rfind('/'));
    if (!dir.empty()) DSEC_RETURN_IF_ERROR(MakeDirs(dir, 0700));
    UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) return ErrnoError("create token file \"" + path + "\"");
    DSEC_RETURN_IF_ERROR(WriteAllFd(fd.get(), RandomHex(32) + "\n", path));
  }
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && (st.st_mode & 077))
    DSEC_LOG_WARN("token file is readable by others: path={} mode={:o}", path, st.st_mode & 0777);
  DSEC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 1 << 20));
  std::vector<std::string> tokens;
  for (auto line : SplitString(text, '\n', true)) {
    line = TrimWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    if (line.size() < 16) return InvalidArgument("tokens must be at least 16 characters");
    tokens.emplace_back(line);
  }
  if (tokens.empty()) return InvalidArgument("token file \"" + path + "\" has no token");
  return tokens;
}

std::string BearerToken(const HttpRequest& req) {
  std::string auth = req.Header("authorization");
  if (auth.size() > 7 && strncasecmp(auth.c_str(), "Bearer ", 7) == 0) return auth.substr(7);
  return {};
}

std::string PathBehindToken(const HttpRequest& req, const std::vector<std::string>& tokens) {
  const std::string bearer = BearerToken(req);
  int auth_headers = 0;
  for (const auto& [k, v] : req.headers) auth_headers += k == "authorization";
  bool ok = false;
  if (auth_headers <= 1 && !bearer.empty())
    for (const auto& t : tokens) ok = ok || ConstantTimeEquals(bearer, t);
  if (ok) return req.path;
  if (req.path.size() < 2 || req.path[0] != '/') return "";
  size_t end = req.path.find('/', 1);
  if (end == std::string::npos) return "";
  std::string_view first = std::string_view(req.path).substr(1, end - 1);
  for (const auto& t : tokens) ok = ok || ConstantTimeEquals(first, t);
  return ok ? req.path.substr(end) : "";
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size() || b.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string HmacSha256(std::string_view key, std::string_view msg) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &n);
  return std::string(reinterpret_cast<char*>(out), n);
}

std::string Sha256Hex(std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), out, &n, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * n);
  for (unsigned int i = 0; i < n; ++i) {
    hex += kHex[out[i] >> 4];
    hex += kHex[out[i] & 15];
  }
  return hex;
}

std::string DerivedKey(const std::vector<std::string>& tokens, std::string_view label) {
  return HmacSha256(tokens.empty() ? std::string_view() : std::string_view(tokens.front()), label);
}

}  // namespace dsec::http
