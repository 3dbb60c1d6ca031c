// Status and Result<T>: the error channel for expected failures (bad file, bad request,
// context overflow). The message is written for the user and names the file/field/tensor.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "core/check.h"

namespace ds {

enum class ErrorCode { kOk = 0, kInvalidArgument, kNotFound, kIo, kUnsupported, kOutOfRange, kResourceExhausted, kInternal };

class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return Status(ErrorCode::kInvalidArgument, std::move(m)); }
inline Status not_found(std::string m) { return Status(ErrorCode::kNotFound, std::move(m)); }
inline Status io_error(std::string m) { return Status(ErrorCode::kIo, std::move(m)); }
inline Status unsupported(std::string m) { return Status(ErrorCode::kUnsupported, std::move(m)); }
inline Status out_of_range(std::string m) { return Status(ErrorCode::kOutOfRange, std::move(m)); }

template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}                 // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {            // NOLINT
    DS_ASSERT(!std::get<Status>(v_).ok(), "a Result holding an error needs a failed Status");
  }
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    DS_ASSERT(ok(), "value() of a failed Result: %s", std::get<Status>(v_).message().c_str());
    return std::get<T>(v_);
  }
  T&& value() && {
    DS_ASSERT(ok(), "value() of a failed Result: %s", std::get<Status>(v_).message().c_str());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ds

// Propagates a failed Status from an expression returning Status.
#define DS_RETURN_IF_ERROR(expr)        \
  do {                                  \
    ::ds::Status ds_st_ = (expr);       \
    if (!ds_st_.ok()) return ds_st_;    \
  } while (0)

#define DS_CONCAT_INNER(a, b) a##b
#define DS_CONCAT(a, b) DS_CONCAT_INNER(a, b)
// Declares `lhs` from a Result-returning expression or returns its Status.
#define DS_ASSIGN_OR_RETURN(lhs, expr) DS_ASSIGN_OR_RETURN_IMPL(DS_CONCAT(ds_res_, __LINE__), lhs, expr)
#define DS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
