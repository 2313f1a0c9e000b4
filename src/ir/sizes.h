// Size arithmetic on numbers that come from files, attributes, input values and shapes.
//
// A model file is untrusted input: a product or sum computed from it can wrap around and turn
// a huge size into a small allocation that a kernel then overruns. Every such computation goes
// through these helpers: an overflow throws a kiln::Error (kInvalidModel) that says what was
// being computed; a schema or kernel that catches nothing gets its node added by its caller.
// Shapes themselves are checked where they enter the IR (ir::check_shape_size, shape_numel),
// so products of one checked shape's dimensions need no further check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/error.h"

namespace kiln {

[[noreturn]] void throw_size_overflow(const char* what);

inline int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw_size_overflow(what);
  return r;
}

inline int64_t checked_sub(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) throw_size_overflow(what);
  return r;
}

inline int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw_size_overflow(what);
  return r;
}

// "12.3 MiB": a byte count for messages.
std::string format_bytes(double bytes);

}  // namespace kiln
