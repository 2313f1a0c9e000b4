#include "compiler/input_values.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace kiln::compiler {

namespace {

bool numeric(DType d) {
  switch (d) {
    case DType::kBool: case DType::kInt8: case DType::kInt16: case DType::kInt32: case DType::kInt64:
    case DType::kUInt8: case DType::kUInt16: case DType::kUInt32: case DType::kUInt64:
    case DType::kFloat16: case DType::kFloat32: case DType::kFloat64: return true;
    default: return false;
  }
}

// Writes `v` as element i of `t`; false when the dtype cannot hold it exactly.
bool set_element(Tensor& t, int64_t i, double v) {
  void* p = static_cast<unsigned char*>(t.raw()) + static_cast<size_t>(i) * element_size(t.dtype());
  auto write = [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      // The largest 64-bit integers round up as doubles: their bound is exclusive.
      const double lo = static_cast<double>(std::numeric_limits<T>::lowest());
      const double hi = static_cast<double>(std::numeric_limits<T>::max()) + (sizeof(T) < 8 ? 1.0 : 0.0);
      if (!(v >= lo && v < hi)) return false;
    }
    const T x = static_cast<T>(v);
    std::memcpy(p, &x, sizeof x);
    return static_cast<double>(x) == v || (std::isnan(v) && std::isnan(static_cast<double>(x)));
  };
  switch (t.dtype()) {
    case DType::kBool: {
      if (v != 0 && v != 1) return false;
      const uint8_t b = v != 0;
      std::memcpy(p, &b, 1);
      return true;
    }
    case DType::kInt8: return write(int8_t{});
    case DType::kInt16: return write(int16_t{});
    case DType::kInt32: return write(int32_t{});
    case DType::kInt64: return write(int64_t{});
    case DType::kUInt8: return write(uint8_t{});
    case DType::kUInt16: return write(uint16_t{});
    case DType::kUInt32: return write(uint32_t{});
    case DType::kUInt64: return write(uint64_t{});
    case DType::kFloat16: {
      const uint16_t h = float_to_half(static_cast<float>(v));
      std::memcpy(p, &h, sizeof h);
      return static_cast<double>(half_to_float(h)) == v || std::isnan(v);
    }
    case DType::kFloat32: return write(float{});
    case DType::kFloat64: return write(double{});
    default: return false;
  }
}

}  // namespace

std::map<std::string, Tensor> resolve_input_values(const std::vector<TensorDesc>& inputs,
                                                   const std::vector<OptimizationProfile>& profiles,
                                                   const std::map<std::string, Tensor>& given) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, values] : given) {
    const TensorDesc* input = nullptr;
    for (const TensorDesc& d : inputs)
      if (d.name == name) input = &d;
    std::string names;
    for (const TensorDesc& d : inputs) names += (names.empty() ? "" : ", ") + d.name;
    if (!input)
      throw Error(ErrorKind::kInvalidArgument, "input values are given for '" + name + "', which is not an input of the model")
          .hint("the model's inputs: " + names);
    const std::string what = "input '" + name + "' (planned by value)";
    if (input->dtype == DType::kString || values.dtype() == DType::kString)
      throw Error(ErrorKind::kInvalidArgument, what + ": string values are not planned by value");
    // Values of another dtype are converted, between the types a double holds exactly.
    if (values.dtype() != input->dtype && (!numeric(input->dtype) || !numeric(values.dtype())))
      throw Error(ErrorKind::kInvalidArgument, "the values given for " + what + " are " + to_string(values.dtype()) +
                                                   ", the input is " + to_string(input->dtype) + ": give them as " +
                                                   to_string(input->dtype));
    std::vector<int64_t> shape;
    for (size_t p = 0; p < profiles.size(); ++p) {
      auto it = profiles[p].find(name);
      if (it == profiles[p].end()) throw Error(ErrorKind::kInternal, "profile " + std::to_string(p) + " has no range for '" + name + "'");
      const ShapeRange& r = it->second;
      if (r.min != r.max || (p > 0 && r.min != shape))
        throw Error(ErrorKind::kInvalidArgument, what + " must have one fixed shape; profile " + std::to_string(p) +
                                                     " lets it range from " + shape_to_string(r.min) + " to " + shape_to_string(r.max))
            .hint("give it one shape (--shapes) in every profile");
      shape = r.min;
    }
    const int64_t count = shape_numel(shape);
    if (count > kMaxInputValueElements)
      throw Error(ErrorKind::kInvalidArgument, what + " has " + std::to_string(count) + " elements; inputs planned by value " +
                                                   "have at most " + std::to_string(kMaxInputValueElements) + " (parameters, not data)");
    if (values.numel() != count)
      throw Error(ErrorKind::kInvalidArgument, std::to_string(values.numel()) + " value(s) are given for " + what +
                                                   ", whose shape " + shape_to_string(shape) + " holds " + std::to_string(count));
    if (values.dtype() == input->dtype) {
      out.emplace(name, values.clone().reshaped(shape));
      continue;
    }
    Tensor converted(input->dtype, shape);
    for (int64_t i = 0; i < count; ++i) {
      const double v = values.value_as_double(i);
      if (!set_element(converted, i, v))
        throw Error(ErrorKind::kInvalidArgument, "value " + std::to_string(v) + " given for " + what + " is not a " +
                                                     to_string(input->dtype));
    }
    out.emplace(name, std::move(converted));
  }
  return out;
}

}  // namespace kiln::compiler
