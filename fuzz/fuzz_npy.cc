// libFuzzer target: arbitrary bytes as a .npy file; what parses must write back and parse
// to the same tensor.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "exercise.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    kiln::fuzz::exercise_npy(bytes);
  } catch (const kiln::Error& e) {
    if (e.kind() == kiln::ErrorKind::kInternal) {
      std::fprintf(stderr, "kiln internal error: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
