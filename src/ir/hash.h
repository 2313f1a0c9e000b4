// FNV-1a over 64 bits: the engine file's checksum, the calibration cache's model fingerprint and
// the cache keys of generated kernels. kiln's offset basis is 1469598103934665603, a digit short
// of the published FNV one (14695981039346656037); it stays, since engine files and calibration
// caches already name their bytes by it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace kiln::ir {

inline constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;

// The hash of n bytes, continuing from `h` (a hash of the bytes before them).
inline uint64_t fnv1a(const char* data, size_t n, uint64_t h = kFnv1aOffset) {
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 1099511628211ull;
  }
  return h;
}

// 16 lower-case hex digits.
inline std::string hex64(uint64_t h) {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

}  // namespace kiln::ir
