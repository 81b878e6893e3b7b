#include "base/status.h"

#include <cstring>

namespace dsec {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kAlreadyExists:
      return "already_exists";
    case StatusCode::kPermissionDenied:
      return "permission_denied";
    case StatusCode::kUnauthenticated:
      return "unauthenticated";
    case StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case StatusCode::kTooLarge:
      return "too_large";
    case StatusCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kUnimplemented:
      return "unimplemented";
    case StatusCode::kAborted:
      return "aborted";
    case StatusCode::kOverCapacity:
      return "over_capacity";
    case StatusCode::kGone:
      return "gone";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m), errno_);
}

StatusCode StatusCodeFromErrno(int err) {
  switch (err) {
    case 0:
      return StatusCode::kOk;
    case ENOENT:
    case ESRCH:
    case ENXIO:
      return StatusCode::kNotFound;
    case EEXIST:
      return StatusCode::kAlreadyExists;
    case EPERM:
    case EACCES:
    case EROFS:
      return StatusCode::kPermissionDenied;
    case EINVAL:
    case ENOTDIR:
    case EISDIR:
    case ENAMETOOLONG:
    case ELOOP:
    case EXDEV:
    case EBADF:
      return StatusCode::kInvalidArgument;
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case EAGAIN:
    case EMLINK:
      return StatusCode::kResourceExhausted;
    case EFBIG:
    case E2BIG:
    case EMSGSIZE:
      return StatusCode::kTooLarge;
    case ETIMEDOUT:
      return StatusCode::kDeadlineExceeded;
    case ENOSYS:
    case EOPNOTSUPP:
      return StatusCode::kUnimplemented;
    case EBUSY:
    case ENOTEMPTY:
      return StatusCode::kFailedPrecondition;
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kInternal;
  }
}

Status ErrnoStatus(int err, std::string_view what) {
  std::string m(what);
  m += ": ";
  const char* name = strerrorname_np(err);
  m += name ? name : "E?";
  m += " (";
  m += strerror(err);
  m += ")";
  return Status(StatusCodeFromErrno(err), std::move(m), err);
}

}  // namespace dsec
