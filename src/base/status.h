// Status and StatusOr: errors as values, with errno context (LevelDB/Abseil style).
// Used by every module; errno -> StatusCode mapping lives in one place (status.cc).
#pragma once

#include <cerrno>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace dsec {

enum class StatusCode {
  kOk = 0,
  // The HTTP answer of each is in edge/api.cc (HttpErrorFor); an error carrying an errno from
  // one of the edge's own system calls is 500 there whatever its code.
  kInvalidArgument,     // 400 bad_request
  kNotFound,            // 404 not_found
  kAlreadyExists,       // 409 conflict
  kPermissionDenied,    // 403 forbidden
  kUnauthenticated,     // 401 unauthorized
  kFailedPrecondition,  // 409 conflict (wrong state)
  kResourceExhausted,   // 422 unprocessable: ENOSPC-like exhaustion (the sandbox's disk, ...)
  kTooLarge,            // 413 too_large
  kDeadlineExceeded,    // 503 unavailable
  kUnavailable,         // 503 unavailable
  kUnimplemented,       // 422 unprocessable
  kAborted,             // 409 conflict
  kOverCapacity,        // 429 over_capacity: admission refused, retry later
  kGone,                // 410 gone: it existed and was removed (a sandbox's TTL, say)
  kInternal,            // 500 internal (last: StatusFromJson counts up to it)
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message, int err = 0)
      : code_(code), message_(std::move(message)), errno_(err) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // The errno that caused this error, 0 if none.
  int error_number() const { return errno_; }
  std::string ToString() const;

  // Prepends context: "create sandbox: " + message.
  Status WithContext(std::string_view context) const;

  static Status Ok() { return Status(); }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  int errno_ = 0;
};

inline Status OkStatus() { return Status(); }

// Maps an errno value to a code; the single place this mapping lives.
StatusCode StatusCodeFromErrno(int err);

// "what: ENOENT (No such file or directory)", with code mapped from err.
Status ErrnoStatus(int err, std::string_view what);
// Same, using the current errno.
inline Status ErrnoError(std::string_view what) { return ErrnoStatus(errno, what); }

inline Status InvalidArgument(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status NotFound(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
inline Status FailedPrecondition(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
inline Status ResourceExhausted(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
inline Status InternalError(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
inline Status Unavailable(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
inline Status PermissionDenied(std::string m) {
  return Status(StatusCode::kPermissionDenied, std::move(m));
}
inline Status Unimplemented(std::string m) {
  return Status(StatusCode::kUnimplemented, std::move(m));
}
inline Status OverCapacity(std::string m) {
  return Status(StatusCode::kOverCapacity, std::move(m));
}
inline Status TooLarge(std::string m) { return Status(StatusCode::kTooLarge, std::move(m)); }
inline Status Gone(std::string m) { return Status(StatusCode::kGone, std::move(m)); }
inline Status DeadlineExceeded(std::string m) {
  return Status(StatusCode::kDeadlineExceeded, std::move(m));
}

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& s) : v_(s) {  // NOLINT(google-explicit-constructor)
    if (s.ok()) v_ = Status(StatusCode::kInternal, "StatusOr constructed from OK status");
  }
  StatusOr(Status&& s) : v_(std::move(s)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok())
      v_ = Status(StatusCode::kInternal, "StatusOr constructed from OK status");
  }
  StatusOr(const T& v) : v_(v) {}        // NOLINT(google-explicit-constructor)
  StatusOr(T&& v) : v_(std::move(v)) {}  // NOLINT(google-explicit-constructor)
  template <typename U>
  requires(std::is_constructible_v<T, U&&> && !std::is_same_v<std::decay_t<U>, T> &&
           !std::is_same_v<std::decay_t<U>, Status>) StatusOr(U&& v)
      : v_(T(std::forward<U>(v))) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const& {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  Status status() && { return ok() ? Status() : std::move(std::get<Status>(v_)); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::move(std::get<T>(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(value()); }
  T value_or(T def) const& { return ok() ? value() : std::move(def); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

namespace internal {
inline const Status& AsStatus(const Status& s) { return s; }
template <typename T>
const Status& AsStatus(const StatusOr<T>& s) {
  return s.status();
}
}  // namespace internal

#define DSEC_CONCAT_INNER_(a, b) a##b
#define DSEC_CONCAT_(a, b) DSEC_CONCAT_INNER_(a, b)

#define DSEC_RETURN_IF_ERROR(expr)                                           \
  do {                                                                       \
    auto&& dsec_status_ = (expr);                                            \
    if (!dsec_status_.ok()) return ::dsec::internal::AsStatus(dsec_status_); \
  } while (0)

#define DSEC_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()

#define DSEC_ASSIGN_OR_RETURN(lhs, expr) \
  DSEC_ASSIGN_OR_RETURN_IMPL_(DSEC_CONCAT_(dsec_statusor_, __LINE__), lhs, expr)

}  // namespace dsec
