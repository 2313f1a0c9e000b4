#include "tools/input_files.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "io/npy.h"
#include "onnx/importer.h"

namespace kiln::tools {

namespace fs = std::filesystem;

namespace {

std::string lower_extension(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

}  // namespace

std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& x : names) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::map<std::string, std::string> assign_input_files(const std::vector<std::string>& specs,
                                                      const std::vector<std::string>& input_names) {
  std::map<std::string, std::string> files;
  std::vector<std::string> positional;
  for (const std::string& spec : specs) {
    size_t eq = spec.find('=');
    std::string name = eq == std::string::npos ? "" : spec.substr(0, eq);
    if (!name.empty() && std::find(input_names.begin(), input_names.end(), name) != input_names.end()) {
      if (files.count(name)) throw Error(ErrorKind::kInvalidArgument, "input '" + name + "' is given twice");
      files[name] = spec.substr(eq + 1);
    } else if (!name.empty() && !fs::exists(spec)) {
      throw Error(ErrorKind::kInvalidArgument, "--input " + spec + ": the model has no input named '" + name + "'")
          .hint("its inputs are: " + name_list(input_names));
    } else {
      positional.push_back(spec);
    }
  }
  for (const std::string& path : positional) {
    auto free = std::find_if(input_names.begin(), input_names.end(), [&](const std::string& n) { return !files.count(n); });
    if (free == input_names.end())
      throw Error(ErrorKind::kInvalidArgument, "--input " + path + ": every model input already has a file")
          .hint("the model's inputs are: " + name_list(input_names));
    files[*free] = path;
  }

  return files;
}

// A copy of `t` with another numeric dtype (NumPy writes float64 by default, for one).
// Float targets take any value (rounding to the nearest is what the user expects); integer
// and bool targets must hold every value exactly, since truncating token ids, say, would
// silently run the model on other data than the user's.
Tensor cast_input(const Tensor& t, DType dtype, const std::string& input_name) {
  Tensor out(dtype, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = t.value_as_double(i);
    switch (dtype) {
      case DType::kFloat32: out.data<float>()[i] = static_cast<float>(v); continue;
      case DType::kFloat64: out.data<double>()[i] = v; continue;
      case DType::kFloat16: static_cast<uint16_t*>(out.raw())[i] = float_to_half(static_cast<float>(v)); continue;
      default: break;
    }
    bool exact = std::isfinite(v) && v == std::floor(v);
    if (exact && is_float(t.dtype()) && std::abs(v) >= 9007199254740992.0) exact = false;  // beyond 2^53: not exact
    int64_t iv = exact ? (is_float(t.dtype()) ? static_cast<int64_t>(v) : t.value_as_int(i)) : 0;
    switch (dtype) {
      case DType::kInt64: out.data<int64_t>()[i] = iv; break;
      case DType::kInt32: exact = exact && iv >= INT32_MIN && iv <= INT32_MAX; out.data<int32_t>()[i] = static_cast<int32_t>(iv); break;
      case DType::kInt16: exact = exact && iv >= INT16_MIN && iv <= INT16_MAX; out.data<int16_t>()[i] = static_cast<int16_t>(iv); break;
      case DType::kInt8: exact = exact && iv >= INT8_MIN && iv <= INT8_MAX; out.data<int8_t>()[i] = static_cast<int8_t>(iv); break;
      case DType::kUInt8: exact = exact && iv >= 0 && iv <= UINT8_MAX; out.data<uint8_t>()[i] = static_cast<uint8_t>(iv); break;
      case DType::kBool: exact = exact && (iv == 0 || iv == 1); out.data<bool>()[i] = iv != 0; break;
      default:
        throw Error(ErrorKind::kUnsupported, "input '" + input_name + "': cannot convert " + to_string(t.dtype()) + " data to " +
                                                 to_string(dtype));
    }
    if (!exact)
      throw Error(ErrorKind::kInvalidArgument, fmt::format("input '{}' is {}, but the data given is {} and its value {} (index {}) "
                                                           "is not a {} value",
                                                           input_name, to_string(dtype), to_string(t.dtype()), v, i, to_string(dtype)))
          .hint("convert the data yourself, e.g. a.astype(np." + to_string(dtype) + ")");
  }
  return out;
}

bool is_tensor_file(const std::string& path) {
  const std::string ext = lower_extension(path);
  return ext == ".npy" || ext == ".pb";
}

Tensor read_tensor_input(const std::string& path) {
  if (!fs::exists(path)) throw Error(ErrorKind::kIo, "input file '" + path + "' does not exist");
  if (!is_tensor_file(path))
    throw Error(ErrorKind::kInvalidArgument, "input file '" + path + "' is neither .npy nor .pb (an ONNX TensorProto)");
  return lower_extension(path) == ".npy" ? io::read_npy(path) : onnx_import::read_tensor_file(path);
}

Tensor read_tensor_input(const std::string& path, const TensorDesc& desc) {
  Tensor t = read_tensor_input(path);
  if (t.dtype() != desc.dtype) {
    DType given = t.dtype();
    t = cast_input(t, desc.dtype, desc.name);
    std::cout << fmt::format("note: input '{}' converted from {} to {}\n", desc.name, to_string(given), to_string(desc.dtype));
  }
  return t;
}

}  // namespace kiln::tools
