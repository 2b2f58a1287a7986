// Refusals of the host entry points, thrown as TVM-FFI errors of a named kind (ValueError, TypeError,
// RuntimeError: Python sees those exception types) with a message built by <<:
//
//   if (bad) ATTNGEN_THROW(ValueError) << entry << ": q: expected " << 3 << " dims";
//
// Every piece is out of line and cold: a check costs its call site a compare and a few calls, where the
// stream, string and error construction of TVM_FFI_THROW would be inlined at each of the hundreds of
// checks the entry templates instantiate (that inlined error code was most of a TU's host code and of
// the host compiler's time).
#pragma once
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <sstream>
#include <string>

namespace attngen {

class Raise {
 public:
  [[gnu::cold, gnu::noinline]] Raise(const char* kind, const char* file, int line)
      : kind_(kind), file_(file), line_(line) {}
  Raise(const Raise&) = delete;
  Raise& operator=(const Raise&) = delete;

  [[gnu::cold, gnu::noinline]] Raise& operator<<(const char* s) { return put(s); }
  [[gnu::cold, gnu::noinline]] Raise& operator<<(const std::string& s) { return put(s); }
  [[gnu::cold, gnu::noinline]] Raise& operator<<(int64_t v) { return put(v); }
  [[gnu::cold, gnu::noinline]] Raise& operator<<(uint64_t v) { return put(v); }
  [[gnu::cold, gnu::noinline]] Raise& operator<<(double v) { return put(v); }
  [[gnu::cold, gnu::noinline]] Raise& operator<<(DLDataType t) { return put(t); }
  Raise& operator<<(int v) { return *this << static_cast<int64_t>(v); }
  Raise& operator<<(long long v) { return *this << static_cast<int64_t>(v); }
  Raise& operator<<(unsigned v) { return *this << static_cast<uint64_t>(v); }
  Raise& operator<<(unsigned long long v) { return *this << static_cast<uint64_t>(v); }
  Raise& operator<<(char c) { return *this << std::string(1, c); }
  Raise& operator<<(bool b) { return *this << (b ? "true" : "false"); }
  Raise& operator<<(float v) { return *this << static_cast<double>(v); }

  // throws when the statement that built the message ends
  [[noreturn, gnu::cold, gnu::noinline]] ~Raise() noexcept(false) {
    const TVMFFIByteArray* trace = TVMFFIBacktrace(file_, line_, "", 0);
    throw tvm::ffi::Error(kind_, message_.str(), trace);
  }

 private:
  template <class T>
  Raise& put(const T& v) {
    message_ << v;
    return *this;
  }

  const char* kind_;
  const char* file_;
  int line_;
  std::ostringstream message_;
};

}  // namespace attngen

#define ATTNGEN_THROW(ErrorKind) ::attngen::Raise(#ErrorKind, __FILE__, __LINE__)
