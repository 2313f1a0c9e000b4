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
    case Precision::kBf16: return "bf16";
  }
  return "?";
}

std::string TacticOptions::describe() const {
  const TacticOptions defaults;
  std::string out;
  auto add = [&](const char* name, const std::string& value) { out += (out.empty() ? "" : " ") + std::string(name) + "=" + value; };
  auto flag = [](bool on) { return std::string(on ? "1" : "0"); };
  if (programmatic_launch != defaults.programmatic_launch) add("programmatic_launch", flag(programmatic_launch));
  if (graph_timing != defaults.graph_timing) add("graph_timing", flag(graph_timing));
  if (quantized_conv != defaults.quantized_conv) add("quantized_conv", quantized_conv);
  if (int8_k_splits != defaults.int8_k_splits) add("int8_k_splits", std::to_string(int8_k_splits));
  if (attention != defaults.attention) add("attention", attention);
  if (cudnn_graphs != defaults.cudnn_graphs) add("cudnn_graphs", flag(cudnn_graphs));
  if (conv_as_gemm != defaults.conv_as_gemm) add("conv_as_gemm", flag(conv_as_gemm));
  if (depthwise_kernel != defaults.depthwise_kernel) add("depthwise_kernel", flag(depthwise_kernel));
  if (generated_kernels != defaults.generated_kernels) add("generated_kernels", flag(generated_kernels));
  if (log_candidates != defaults.log_candidates) add("log_candidates", flag(log_candidates));
  return out;
}

}  // namespace kiln
