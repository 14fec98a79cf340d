// Errors: a small exception hierarchy whose messages say, in the user's terms, which function
// failed, with which shapes / dtypes / devices, and what was expected.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kusari {

/// Base of every exception kusari throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// Arrays whose shapes (or numbers of dimensions) do not fit the operation.
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// An operation was given an unsupported dtype, or two dtypes that must agree.
class DtypeError : public Error {
 public:
  using Error::Error;
};

/// Arrays on different devices were mixed, or a device is unavailable.
class DeviceError : public Error {
 public:
  using Error::Error;
};

/// An argument value (axis, size, option) is outside what the function accepts.
class ValueError : public Error {
 public:
  using Error::Error;
};

/// An index or slice falls outside an array or container.
class IndexError : public Error {
 public:
  using Error::Error;
};

/// The operation exists but is not implemented for this device, dtype or configuration.
class NotImplementedError : public Error {
 public:
  using Error::Error;
};

/// Reading or writing a file failed, or its contents are malformed.
class IOError : public Error {
 public:
  using Error::Error;
};

/// A failure in the gradient graph (e.g. backward() on a non-scalar without a gradient).
class GradientError : public Error {
 public:
  using Error::Error;
};

/// A multi-node communicator failed, timed out, or was used inconsistently across ranks.
class CommunicatorError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

[[noreturn]] void assertion_failed(const char* cond, const char* file, int line, const std::string& msg);

}  // namespace detail

/// Throws `ErrorType` with the streamed message parts when `cond` is false.
/// Use for mistakes a user can make: `KUSARI_CHECK(a.ndim() == 2, ShapeError, "matmul: ...", a.shape())`.
#define KUSARI_CHECK(cond, ErrorType, ...)                                 \
  do {                                                                     \
    if (!(cond)) [[unlikely]] {                                            \
      throw ::kusari::ErrorType(::kusari::detail::concat(__VA_ARGS__));    \
    }                                                                      \
  } while (false)

/// Throws `ErrorType` with the streamed message parts.
#define KUSARI_THROW(ErrorType, ...) throw ::kusari::ErrorType(::kusari::detail::concat(__VA_ARGS__))

/// Checks an invariant of kusari's own code; a failure is a bug in kusari, not in the caller.
#define KUSARI_ASSERT(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond)) [[unlikely]] {                                                           \
      ::kusari::detail::assertion_failed(#cond, __FILE__, __LINE__,                       \
                                         ::kusari::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                     \
  } while (false)

}  // namespace kusari
