// Error handling shared by the C interfaces of runtime/cpp: C++ exceptions never cross
// into Rust; each entry point returns 0, or 1 with the message in the caller's buffer.
#pragma once

#include <cstddef>
#include <cstring>
#include <exception>

#include <c10/util/Exception.h>

namespace headcount {

// Copies `what` into `err` (at most `len` - 1 bytes, NUL-terminated).
inline void set_error(const char* what, char* err, size_t len) {
  if (err == nullptr || len == 0) return;
  std::strncpy(err, what, len - 1);
  err[len - 1] = '\0';
}

// Runs `f`: 0 when it returns, 1 with the message of what it threw (libtorch's without its
// C++ backtrace).
template <class F>
int guarded(F&& f, char* err, size_t len) {
  try {
    f();
    return 0;
  } catch (const c10::Error& e) {
    set_error(e.what_without_backtrace(), err, len);
  } catch (const std::exception& e) {
    set_error(e.what(), err, len);
  } catch (...) {
    set_error("unknown C++ exception", err, len);
  }
  return 1;
}

}  // namespace headcount
