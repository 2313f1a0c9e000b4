// What include/kiln/types.h declares beyond plain data.
#include "kiln/types.h"

namespace kiln {

const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kTf32: return "tf32";
    case Precision::kFp16: return "fp16";
    case Precision::kBest: return "best";
    case Precision::kInt8: return "int8";
    case Precision::kFp8: return "fp8";
  }
  return "?";
}

}  // namespace kiln
