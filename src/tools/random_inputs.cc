// Random inputs (see random_inputs.h).
#include "tools/random_inputs.h"

#include "ir/small_types.h"

namespace kiln::tools {

Tensor random_input(const TensorDesc& desc, const std::vector<int64_t>& shape, std::mt19937_64& rng) {
  Tensor t(desc.dtype, shape);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Small non-negative integers: valid as indices, lengths and class ids in most models.
  std::uniform_int_distribution<int> small(0, 9);
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (desc.dtype) {
      case DType::kFloat32: t.data<float>()[i] = normal(rng); break;
      case DType::kFloat64: t.data<double>()[i] = normal(rng); break;
      case DType::kFloat16: static_cast<uint16_t*>(t.raw())[i] = float_to_half(normal(rng)); break;
      case DType::kBFloat16: static_cast<uint16_t*>(t.raw())[i] = float_to_bfloat16(normal(rng)); break;
      case DType::kBool: t.data<bool>()[i] = small(rng) % 2; break;
      case DType::kInt64: t.data<int64_t>()[i] = small(rng); break;
      case DType::kInt32: t.data<int32_t>()[i] = small(rng); break;
      case DType::kInt16: t.data<int16_t>()[i] = static_cast<int16_t>(small(rng)); break;
      case DType::kInt8: t.data<int8_t>()[i] = static_cast<int8_t>(small(rng)); break;
      case DType::kUInt8: t.data<uint8_t>()[i] = static_cast<uint8_t>(small(rng)); break;
      default:
        throw Error(ErrorKind::kUnsupported, "cannot fill " + to_string(desc.dtype) + " input '" + desc.name + "' with random data");
    }
  }
  return t;
}

}  // namespace kiln::tools
