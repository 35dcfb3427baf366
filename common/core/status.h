// One error policy for the whole project:
//  * Functions that can fail for reasons outside the program (bad input, missing files, I/O,
//    exhausted resources) return Status or Result<T> at module boundaries.
//  * Deep inside a module (recursive parsers, interpreters) code may throw pdserve::Error via
//    PDS_THROW / PDS_ENSURE; the module's public entry point converts it to a Status with
//    capture_status(). Nothing else throws across a module boundary.
//  * Broken invariants (programmer errors) use PDS_CHECK, which prints file, line and message
//    and aborts.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace pdserve {

enum class StatusCode {
  kOk,
  kInvalidArgument,     // malformed or out-of-range input from a user or a peer
  kNotFound,            // a file, tensor, route or id that does not exist
  kOutOfRange,          // e.g. a prompt longer than the context
  kFailedPrecondition,  // the system is not in a state to do this
  kResourceExhausted,   // KV pool full, queue full, out of memory
  kUnavailable,         // a device or peer that is not there (retryable)
  kDeadlineExceeded,    // a wait ran past its deadline
  kCancelled,           // the caller gave up (client disconnected, request aborted)
  kDataLoss,            // truncated or corrupted data
  kUnimplemented,       // a valid request for something not supported
  kPermissionDenied,    // a caller without the credentials this needs (the cluster token)
  kInternal,            // a bug or an unexpected library failure
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message".
  std::string to_string() const;

  // Prefix context to the message ("while loading x: <message>").
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string msg) {
  return {StatusCode::kInvalidArgument, std::move(msg)};
}
inline Status not_found(std::string msg) {
  return {StatusCode::kNotFound, std::move(msg)};
}
inline Status out_of_range(std::string msg) {
  return {StatusCode::kOutOfRange, std::move(msg)};
}
inline Status failed_precondition(std::string msg) {
  return {StatusCode::kFailedPrecondition, std::move(msg)};
}
inline Status resource_exhausted(std::string msg) {
  return {StatusCode::kResourceExhausted, std::move(msg)};
}
inline Status unavailable(std::string msg) {
  return {StatusCode::kUnavailable, std::move(msg)};
}
inline Status deadline_exceeded(std::string msg) {
  return {StatusCode::kDeadlineExceeded, std::move(msg)};
}
inline Status cancelled(std::string msg) { return {StatusCode::kCancelled, std::move(msg)}; }
inline Status data_loss(std::string msg) {
  return {StatusCode::kDataLoss, std::move(msg)};
}
inline Status unimplemented(std::string msg) {
  return {StatusCode::kUnimplemented, std::move(msg)};
}
inline Status permission_denied(std::string msg) {
  return {StatusCode::kPermissionDenied, std::move(msg)};
}
inline Status internal_error(std::string msg) {
  return {StatusCode::kInternal, std::move(msg)};
}

// A value or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : state_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(state_).ok()) {
      state_ = Status(StatusCode::kInternal, "Result constructed from an OK status");
    }
  }

  bool ok() const { return std::holds_alternative<T>(state_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(state_);
  }
  T& value() & { return checked(); }
  const T& value() const& { return const_cast<Result*>(this)->checked(); }
  T&& value() && { return std::move(checked()); }
  T* operator->() { return &checked(); }
  const T* operator->() const { return &const_cast<Result*>(this)->checked(); }
  T& operator*() & { return checked(); }
  const T& operator*() const& { return const_cast<Result*>(this)->checked(); }

 private:
  T& checked() {
    if (!ok()) {
      std::fprintf(stderr, "fatal: value() of a failed Result: %s\n",
                   std::get<Status>(state_).to_string().c_str());
      std::abort();
    }
    return std::get<T>(state_);
  }
  std::variant<T, Status> state_;
};

// Exception used only inside a module; see the policy at the top of this file.
class Error : public std::exception {
 public:
  explicit Error(Status status) : status_(std::move(status)) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return status_.message().c_str(); }

 private:
  Status status_;
};

[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               std::string_view message);

// Runs fn (returning Status or Result<T>) and turns a pdserve::Error, std::bad_alloc or any
// other std::exception thrown inside into a Status.
template <typename Fn>
auto capture_status(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {
    return e.status();
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kResourceExhausted, "out of memory");
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, e.what());
  }
}

}  // namespace pdserve

#define PDS_CONCAT_INNER(a, b) a##b
#define PDS_CONCAT(a, b) PDS_CONCAT_INNER(a, b)

// Return the Status of `expr` from the enclosing function if it is not OK.
#define PDS_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::pdserve::Status pds_status_ = (expr);    \
    if (!pds_status_.ok()) return pds_status_; \
  } while (0)

// `PDS_ASSIGN_OR_RETURN(auto x, f());` binds the value of a Result or returns its Status.
#define PDS_ASSIGN_OR_RETURN(lhs, expr) \
  PDS_ASSIGN_OR_RETURN_IMPL(PDS_CONCAT(pds_result_, __LINE__), lhs, expr)
#define PDS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

// Throw a pdserve::Error (inside a module only).
#define PDS_THROW(code, msg) throw ::pdserve::Error(::pdserve::Status((code), (msg)))
#define PDS_ENSURE(cond, code, msg)    \
  do {                                 \
    if (!(cond)) PDS_THROW(code, msg); \
  } while (0)

// Abort with file, line and message when an invariant is broken.
#define PDS_CHECK(cond, msg)                                                \
  do {                                                                      \
    if (!(cond)) ::pdserve::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
