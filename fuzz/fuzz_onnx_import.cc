// libFuzzer target: arbitrary bytes as an ONNX model through import, passes, engine build
// and (small shapes only) one run. Any exception but a kiln::Error of a kind a user can
// cause is a finding; so are crashes and sanitizer reports.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "exercise.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    kiln::fuzz::exercise_model(bytes);
  } catch (const kiln::Error& e) {
    if (e.kind() == kiln::ErrorKind::kInternal) {
      std::fprintf(stderr, "kiln internal error: %s\n", e.what());
      std::abort();
    }
  }
  // Anything else escapes and libFuzzer reports it as a crash (uncaught exception).
  return 0;
}
