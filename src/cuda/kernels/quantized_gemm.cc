#include "cuda/kernels/quantized_gemm.h"

#include <limits>
#include <sstream>

#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

std::vector<const QuantizedGemmKernel*> kernels_for(DType input) {
  return input == DType::kInt8 ? int8_quantized_gemm_kernels() : fp8_quantized_gemm_kernels();
}

QuantizedGemmProblem problem_of(const QuantizedGemmSpec& s) {
  QuantizedGemmProblem p;
  p.m = static_cast<int>(s.m);
  p.n = static_cast<int>(s.n);
  p.k = static_cast<int>(s.k);
  p.act = s.act;
  p.out_scale = s.out_scale;
  return p;
}

}  // namespace

std::string quantized_gemm_unsupported(const QuantizedGemmSpec& s, const cudaDeviceProp& device) {
#ifdef KILN_QUANTIZED_GEMM_ABSENT
  (void)s, (void)device;
  return KILN_QUANTIZED_GEMM_ABSENT;
#else
  if (device.major != 9 || device.minor != 0) return "CUTLASS's INT8/FP8 products are compiled for Hopper (sm_90a) only";
  if (s.input != DType::kInt8 && s.input != DType::kFloat8E4M3FN) return "the input must be int8 or float8e4m3fn";
  if (s.output != DType::kFloat16 && s.output != s.input) return "the output must be float16 or the input's type";
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (s.m < 1 || s.n < 1 || s.k < 1 || s.m > kMax || s.n > kMax || s.k > kMax || s.m * s.n > kMax || s.m * s.k > kMax)
    return "the product's sizes exceed CUTLASS's 32-bit extents";
  // TMA moves 16-byte rows: K 8-bit values, N float16 or 8-bit values.
  if (s.k % 16 != 0 || s.n % 16 != 0) return "CUTLASS's INT8/FP8 products need multiples of 16 channels";
  if (static_cast<int64_t>(s.alpha.size()) != s.n) return "one scale per output channel";
  if (!s.bias.empty() && static_cast<int64_t>(s.bias.size()) != s.n) return "one bias per output channel";
  return "";
#endif
}

QuantizedGemm::QuantizedGemm(const QuantizedGemmSpec& spec, const void* weights, BuildServices& services,
                             const std::string& only_kernel)
    : spec_(spec), weights_(weights) {
  if (const std::string why = quantized_gemm_unsupported(spec_, services.device()); !why.empty())
    throw Error(ErrorKind::kUnsupported, why);
  alpha_ = static_cast<const float*>(services.upload(spec_.alpha.data(), spec_.alpha.size() * sizeof(float)));
  if (!spec_.bias.empty())
    bias_ = static_cast<const float*>(services.upload(spec_.bias.data(), spec_.bias.size() * sizeof(float)));
  QuantizedGemmProblem p = problem_of(spec_);
  p.x = p.w = weights_;
  p.y = const_cast<void*>(weights_);  // only sizes and alignments are checked
  p.alpha = alpha_;
  p.bias = bias_;
  p.z = spec_.has_z ? weights_ : nullptr;
  std::string names;
  for (const QuantizedGemmKernel* k : kernels_for(spec_.input)) {
    if (k->output != spec_.output) continue;
    names += (names.empty() ? "" : ", ") + std::string(k->name);
    if ((!only_kernel.empty() && only_kernel != k->name) || !k->supports(p)) continue;
    KILN_CUDA_CHECK(k->prepare());
    candidates_.push_back(k);
  }
  if (candidates_.empty())
    throw Error(ErrorKind::kUnsupported,
                only_kernel.empty() ? std::string("no CUTLASS INT8/FP8 kernel of this build takes the product")
                                    : "no CUTLASS kernel named '" + only_kernel + "' takes the product (this build's: " +
                                          names + ")");
}

QuantizedGemm::~QuantizedGemm() = default;

size_t QuantizedGemm::workspace_bytes() const {
  QuantizedGemmProblem p = problem_of(spec_);
  return aligned(candidates_[static_cast<size_t>(selected_)]->workspace_bytes(p));
}

void QuantizedGemm::run(const void* x, const void* z, void* y, void* workspace, cudaStream_t stream) const {
  QuantizedGemmProblem p = problem_of(spec_);
  p.x = x;
  p.w = weights_;
  p.alpha = alpha_;
  p.bias = bias_;
  p.z = spec_.has_z ? z : nullptr;
  p.y = y;
  KILN_CUDA_CHECK(candidates_[static_cast<size_t>(selected_)]->run(p, workspace, stream));
}

std::string QuantizedGemm::name() const {
  std::ostringstream s;
  s << "cutlass:" << (spec_.input == DType::kInt8 ? "int8 " : "fp8 ") << candidates_[static_cast<size_t>(selected_)]->name;
  return s.str();
}

}  // namespace kiln::cuda
