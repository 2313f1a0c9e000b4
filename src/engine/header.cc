#include "engine/header.h"

#include "ir/parameter_inputs.h"

namespace kiln::engine_file {

namespace {

// Inputs planned by value (BuildOptions::input_values): dtype, shape and the bytes in hex, exact
// for every dtype.
constexpr int64_t kMaxInputValueElements = ir::kMaxParameterElements;

nlohmann::json input_values_to_json(const std::map<std::string, Tensor>& values) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, t] : values) {
    static const char* digits = "0123456789abcdef";
    std::string hex;
    const auto* bytes = static_cast<const unsigned char*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i) hex += {digits[bytes[i] >> 4], digits[bytes[i] & 15]};
    out[name] = {{"dtype", to_string(t.dtype())}, {"shape", t.shape()}, {"data", hex}};
  }
  return out;
}

std::map<std::string, Tensor> input_values_from_json(const nlohmann::json& j) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, v] : j.items()) {
    const std::string what = "the engine file's values of input '" + name + "'";
    const std::string dtype_name = v.at("dtype").get<std::string>();
    DType dtype = DType::kUndefined;
    for (DType d : {DType::kBool, DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64, DType::kUInt8, DType::kUInt16,
                    DType::kUInt32, DType::kUInt64, DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                    DType::kFloat8E4M3FN, DType::kFloat8E4M3FNUZ, DType::kFloat8E5M2, DType::kFloat8E5M2FNUZ, DType::kUInt4,
                    DType::kInt4, DType::kFloat4E2M1, DType::kUInt2, DType::kInt2})
      if (to_string(d) == dtype_name) dtype = d;
    if (dtype == DType::kUndefined) throw Error(ErrorKind::kInvalidModel, what + " have dtype '" + dtype_name + "'");
    const std::vector<int64_t> shape = v.at("shape").get<std::vector<int64_t>>();
    int64_t count = 1;
    for (int64_t d : shape) {
      if (d < 0 || d > kMaxInputValueElements) throw Error(ErrorKind::kInvalidModel, what + " have shape " + shape_to_string(shape));
      count *= d;
      if (count > kMaxInputValueElements)
        throw Error(ErrorKind::kInvalidModel, what + " have more than " + std::to_string(kMaxInputValueElements) + " elements");
    }
    const std::string hex = v.at("data").get<std::string>();
    Tensor t(dtype, shape);
    if (hex.size() != 2 * t.nbytes())
      throw Error(ErrorKind::kInvalidModel, what + " hold " + std::to_string(hex.size() / 2) + " bytes, not " + std::to_string(t.nbytes()));
    auto nibble = [&](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      throw Error(ErrorKind::kInvalidModel, what + " are not hexadecimal");
    };
    auto* bytes = static_cast<unsigned char*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
    out.emplace(name, std::move(t));
  }
  return out;
}

BuildOptions options_from_json(const nlohmann::json& o) {
  BuildOptions options;
  const std::string precision = o.at("precision").get<std::string>();
  options.precision = precision == "fp16" ? Precision::kFp16 : precision == "tf32" ? Precision::kTf32
                      : precision == "best" ? Precision::kBest : precision == "int8" ? Precision::kInt8
                      : precision == "fp8" ? Precision::kFp8 : precision == "fp32" ? Precision::kFp32
                      : precision == "bf16" ? Precision::kBf16
                      : throw Error(ErrorKind::kInvalidModel, "the engine file names an unknown precision '" + precision + "'");
  if (o.contains("int8_scales")) options.int8_scales = o.at("int8_scales").get<std::map<std::string, float>>();
  if (o.contains("float_layers")) options.float_layers = o.at("float_layers").get<std::vector<std::string>>();
  if (o.contains("fp32_layers")) options.fp32_layers = o.at("fp32_layers").get<std::vector<std::string>>();
  options.optimize = o.at("optimize").get<bool>();
  options.allow_cpu_fallback = o.at("allow_cpu_fallback").get<bool>();
  // Engine files from before row stages ran their tails on the CPU engine whole.
  options.gpu_row_stages = o.contains("gpu_row_stages") && o.at("gpu_row_stages").get<bool>();
  if (o.contains("profile_timing_step")) options.profile_timing_step = o.at("profile_timing_step").get<double>();
  if (o.contains("input_values")) options.input_values = input_values_from_json(o.at("input_values"));
  if (o.contains("tactic_options")) {
    const nlohmann::json& t = o.at("tactic_options");
    TacticOptions& tactics = options.tactics;
    tactics.programmatic_launch = t.at("programmatic_launch").get<bool>();
    tactics.graph_timing = t.at("graph_timing").get<bool>();
    tactics.quantized_conv = t.at("quantized_conv").get<std::string>();
    tactics.int8_k_splits = t.at("int8_k_splits").get<int>();
    if (t.contains("attention")) tactics.attention = t.at("attention").get<std::string>();
    tactics.cudnn_graphs = t.at("cudnn_graphs").get<bool>();
    tactics.conv_as_gemm = t.at("conv_as_gemm").get<bool>();
    tactics.depthwise_kernel = t.at("depthwise_kernel").get<bool>();
    tactics.generated_kernels = t.at("generated_kernels").get<bool>();
    tactics.log_candidates = t.at("log_candidates").get<bool>();
    if (!tactics.attention.empty() && tactics.attention != "products" && tactics.attention != "cudnn" &&
        tactics.attention != "kernel")
      throw Error(ErrorKind::kInvalidModel, "the engine file's tactic options ask for attention tactic '" +
                                                tactics.attention + "' (products, cudnn or kernel)");
    if (tactics.int8_k_splits < 0 || tactics.int8_k_splits > 8)
      throw Error(ErrorKind::kInvalidModel, "the engine file's tactic options ask for int8_k_splits " +
                                                std::to_string(tactics.int8_k_splits) + " (0 to 8)");
  }
  return options;
}

nlohmann::json tactic_options_to_json(const TacticOptions& t) {
  return {{"programmatic_launch", t.programmatic_launch}, {"graph_timing", t.graph_timing},
          {"quantized_conv", t.quantized_conv},         {"int8_k_splits", t.int8_k_splits},
          {"attention", t.attention},
          {"cudnn_graphs", t.cudnn_graphs},             {"conv_as_gemm", t.conv_as_gemm},
          {"depthwise_kernel", t.depthwise_kernel},     {"generated_kernels", t.generated_kernels},
          {"log_candidates", t.log_candidates}};
}

nlohmann::json profiles_to_json(const std::vector<OptimizationProfile>& profiles) {
  nlohmann::json out = nlohmann::json::array();
  for (const OptimizationProfile& p : profiles) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [name, r] : p) j[name] = {{"min", r.min}, {"opt", r.opt}, {"max", r.max}};
    out.push_back(j);
  }
  return out;
}

std::vector<OptimizationProfile> profiles_from_json(const nlohmann::json& j) {
  std::vector<OptimizationProfile> out;
  for (const nlohmann::json& p : j) {
    OptimizationProfile profile;
    for (const auto& [name, r] : p.items())
      profile[name] = ShapeRange{r.at("min").get<std::vector<int64_t>>(), r.at("opt").get<std::vector<int64_t>>(),
                                 r.at("max").get<std::vector<int64_t>>()};
    out.push_back(std::move(profile));
  }
  return out;
}

nlohmann::json descs_to_json(const std::vector<TensorDesc>& list) {
  nlohmann::json out = nlohmann::json::array();
  for (const TensorDesc& d : list) out.push_back({{"name", d.name}, {"dtype", to_string(d.dtype)}, {"shape", d.shape}});
  return out;
}

}  // namespace

nlohmann::json to_json(const Header& h) {
  return {{"kiln_version", h.kiln_version},
          {"backend", h.backend},
          {"device", h.device},
          {"options",
           {{"precision", to_string(h.options.precision)},
            {"optimize", h.options.optimize},
            {"allow_cpu_fallback", h.options.allow_cpu_fallback},
            {"gpu_row_stages", h.options.gpu_row_stages},
            {"profile_timing_step", h.options.profile_timing_step},
            {"input_values", input_values_to_json(h.options.input_values)},
            {"int8_scales", h.options.int8_scales},
            {"float_layers", h.options.float_layers},
            {"fp32_layers", h.options.fp32_layers},
            {"tactic_options", tactic_options_to_json(h.options.tactics)}}},
          {"model_name", h.model_name},
          {"inputs", descs_to_json(h.inputs)},
          {"outputs", descs_to_json(h.outputs)},
          {"profiles", profiles_to_json(h.profiles)},
          {"int8_kept_float", h.kept_float},
          {"tactics", h.tactics}};
}

Header header_from_json(const nlohmann::json& j, const std::string& path) {
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.contains(key))
      throw Error(ErrorKind::kInvalidModel, std::string("the engine file's header has no '") + key + "'").file(path);
    return j.at(key);
  };
  Header h;
  try {
    h.kiln_version = field("kiln_version").get<std::string>();
    if (h.kiln_version != KILN_VERSION)
      throw Error(ErrorKind::kInvalidModel, "the engine was built by kiln " + h.kiln_version + ", this is kiln " + KILN_VERSION)
          .file(path)
          .hint("rebuild it with this kiln (kiln build)");
    h.backend = field("backend").get<std::string>();
    if (h.backend != "cpu" && h.backend != "cuda")
      throw Error(ErrorKind::kInvalidModel, "unknown engine backend '" + h.backend + "'").file(path);
    h.options = options_from_json(field("options"));
    if (h.backend == "cuda") {
      h.device = field("device");
      h.tactics = field("tactics").get<std::map<std::string, std::string>>();
      h.profiles = profiles_from_json(field("profiles"));
    }
    if (j.contains("model_name")) h.model_name = j.at("model_name").get<std::string>();
    if (j.contains("int8_kept_float")) h.kept_float = j.at("int8_kept_float").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kInvalidModel, std::string("the engine file's header is malformed: ") + e.what()).file(path);
  } catch (Error& e) {
    if (e.file_path().empty()) e.file(path);
    throw;
  }
  return h;
}

}  // namespace kiln::engine_file
