#include "base/status.h"

#include <gtest/gtest.h>

namespace dsec {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd");
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  DSEC_ASSIGN_OR_RETURN(int h, Half(x));
  DSEC_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  DSEC_RETURN_IF_ERROR(Half(x));
  return OkStatus();
}

TEST(StatusTest, ErrnoMessageNamesCallAndErrno) {
  Status s = ErrnoStatus(ENOENT, "open \"/x\"");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.error_number(), ENOENT);
  EXPECT_EQ(s.message(), "open \"/x\": ENOENT (No such file or directory)");
  EXPECT_EQ(ErrnoStatus(ENOSPC, "w").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(EPERM, "w").code(), StatusCode::kPermissionDenied);
}

TEST(StatusTest, MacrosPropagate) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckEven(2).ok());
  EXPECT_FALSE(CheckEven(3).ok());
}

TEST(StatusTest, WithContextKeepsCodeAndErrno) {
  Status s = ErrnoStatus(EACCES, "mkdir").WithContext("create sandbox");
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(s.error_number(), EACCES);
  EXPECT_EQ(s.message().rfind("create sandbox: mkdir: EACCES", 0), 0u);
}

TEST(StatusTest, StatusOrFromOkIsAnError) {
  StatusOr<int> v = OkStatus();
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace dsec
