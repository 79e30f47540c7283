// Status / Result<T>: errors that cross a boundary (parse, load, I/O, requests) are values.
// SLUICE_CHECK is for programming errors only and is always on (never compiled out).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace sluice {

// Error categories map to process exit codes in app/: bad input is exit 2.
enum class ErrorCode { kOk = 0, kInvalidArgument, kCorruptFile, kUnsupported, kIo, kOutOfMemory, kInternal };

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }

  bool is_ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {ErrorCode::kInvalidArgument, std::move(m)}; }
inline Status corrupt_file(std::string m) { return {ErrorCode::kCorruptFile, std::move(m)}; }
inline Status unsupported(std::string m) { return {ErrorCode::kUnsupported, std::move(m)}; }
inline Status io_error(std::string m) { return {ErrorCode::kIo, std::move(m)}; }
inline Status out_of_memory(std::string m) { return {ErrorCode::kOutOfMemory, std::move(m)}; }
inline Status internal_error(std::string m) { return {ErrorCode::kInternal, std::move(m)}; }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}              // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {        // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).is_ok()) v_ = Status(ErrorCode::kInternal, "Result constructed from an ok Status");
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOkStatus;  // immutable
    return is_ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &std::get<T>(v_); }
  const T* operator->() const { return &std::get<T>(v_); }
  T& operator*() & { return std::get<T>(v_); }
  const T& operator*() const& { return std::get<T>(v_); }

 private:
  std::variant<T, Status> v_;
};

[[noreturn]] inline void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "sluice: internal check failed at %s:%d: %s: %s\n", file, line, cond, msg.c_str());
  std::abort();
}

}  // namespace sluice

// Programming-error check, always on.
#define SLUICE_CHECK(cond, msg)                                                   \
  do {                                                                            \
    if (!(cond)) ::sluice::check_failed(__FILE__, __LINE__, #cond, (msg));        \
  } while (0)

// Propagate an error Status from an expression returning Status.
#define SLUICE_RETURN_IF_ERROR(expr)             \
  do {                                           \
    ::sluice::Status _st = (expr);               \
    if (!_st.is_ok()) return _st;                \
  } while (0)

#define SLUICE_CONCAT_INNER(a, b) a##b
#define SLUICE_CONCAT(a, b) SLUICE_CONCAT_INNER(a, b)
// `SLUICE_ASSIGN_OR_RETURN(auto x, f());` unwraps a Result or returns its Status.
#define SLUICE_ASSIGN_OR_RETURN(lhs, expr) SLUICE_ASSIGN_OR_RETURN_IMPL(SLUICE_CONCAT(_res_, __LINE__), lhs, expr)
#define SLUICE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.is_ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
