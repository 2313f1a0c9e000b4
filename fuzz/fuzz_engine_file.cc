// libFuzzer target: arbitrary bytes as a kiln engine file, as they are and with the checksum
// fixed up (see exercise_engine_file); anything but a kiln::Error (or an internal one) is a bug.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "exercise.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  for (bool fix : {false, true}) {
    try {
      kiln::fuzz::exercise_engine_file(bytes, fix);
    } catch (const kiln::Error& e) {
      if (e.kind() == kiln::ErrorKind::kInternal) {
        std::fprintf(stderr, "kiln internal error: %s\n", e.what());
        std::abort();
      }
    }
  }
  return 0;
}
