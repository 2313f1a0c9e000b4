#include "cuda/kernels/fp8_gemm.h"

#include <cuda_fp16.h>

#include <sstream>

#include "cuda/kernels/cublaslt.h"
#include "cuda/kernels/epilogue.h"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

// The most workspace an algorithm may ask for; the product holds what the selected one asks.
constexpr size_t kLibraryWorkspace = size_t{32} << 20;
constexpr int kMaxCandidates = 8;

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

bool library_activation(const ir::Activation& act) {
  return act.none() || act.kind == ir::ActivationKind::kRelu || act.kind == ir::ActivationKind::kGeluTanh;
}

cublasLtEpilogue_t epilogue_for(bool bias, ir::ActivationKind act) {
  if (act == ir::ActivationKind::kRelu) return bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  if (act == ir::ActivationKind::kGeluTanh) return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

}  // namespace

std::string fp8_gemm_unsupported(const Fp8GemmSpec& s) {
  // cuBLASLt's FP8 products take K and the leading dimensions in multiples of 16.
  if (s.m < 1 || s.n % 16 != 0 || s.k % 16 != 0) return "cuBLASLt's FP8 products need multiples of 16 channels";
  if (static_cast<int64_t>(s.w_scales.size()) != s.n) return "one weight scale per output channel";
  if (!s.bias.empty() && static_cast<int64_t>(s.bias.size()) != s.n) return "one bias per output channel";
  return "";
}

Fp8Gemm::Fp8Gemm(const Fp8GemmSpec& spec, const void* weights, BuildServices& services) : spec_(spec), weights_(weights) {
  if (const std::string why = fp8_gemm_unsupported(spec_); !why.empty()) throw Error(ErrorKind::kUnsupported, why);
  a_scales_ = services.upload(spec_.w_scales.data(), spec_.w_scales.size() * sizeof(float));
  const std::vector<float> per_token(static_cast<size_t>(spec_.m), spec_.x_scale);
  b_scales_ = services.upload(per_token.data(), per_token.size() * sizeof(float));
  const bool has_bias = !spec_.bias.empty();
  if (has_bias) {
    std::vector<__half> half_bias(spec_.bias.size());
    for (size_t i = 0; i < half_bias.size(); ++i) half_bias[i] = __float2half_rn(spec_.bias[i]);
    bias_ = services.upload(half_bias.data(), half_bias.size() * sizeof(__half));
    finish_bias_ = static_cast<const float*>(services.upload(spec_.bias.data(), spec_.bias.size() * sizeof(float)));
  }

  // Column-major as cuBLASLt sees it: D [N, M] = W [N, K] (stored [K, N], transposed) times
  // X^T [K, M]; D read row-major is Y [M, N].
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_, CUDA_R_8F_E4M3, static_cast<uint64_t>(spec_.k),
                                               static_cast<uint64_t>(spec_.n), spec_.k));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_, CUDA_R_8F_E4M3, static_cast<uint64_t>(spec_.k),
                                               static_cast<uint64_t>(spec_.m), spec_.k));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d_, CUDA_R_16F, static_cast<uint64_t>(spec_.n),
                                               static_cast<uint64_t>(spec_.m), spec_.n));

  // The whole epilogue in cuBLASLt where it has one, else the bias there and the activation
  // after, else both after: the first of these that cuBLASLt runs.
  const bool library_act = library_activation(spec_.act);
  struct Variant {
    bool act, bias;
  };
  std::vector<Variant> variants;
  if (library_act) variants.push_back({true, true});
  if (!spec_.act.none()) variants.push_back({false, true});
  if (has_bias) variants.push_back({false, false});
  if (variants.empty()) variants.push_back({true, true});  // nothing to fuse
  for (const Variant& v : variants) {
    if (desc_) cublasLtMatmulDescDestroy(desc_), desc_ = nullptr;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = CUBLAS_OP_T, op_b = CUBLAS_OP_N;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    // Hopper's FP8 tensor cores accumulate in fewer than 32 bits unless the kernel promotes
    // partial sums; fast accumulation skips that, as TensorRT's and PyTorch's fast paths do
    // (products of K in the thousands stay within the tests' FP8 tolerances).
    const int8_t fast_accumulation = 1;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accumulation,
                                                     sizeof(fast_accumulation)));
    const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, sizeof(outer)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer, sizeof(outer)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scales_, sizeof(a_scales_)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scales_, sizeof(b_scales_)));
    const bool bias_here = has_bias && v.bias;
    const cublasLtEpilogue_t epilogue = epilogue_for(bias_here, v.act ? spec_.act.kind : ir::ActivationKind::kNone);
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias_here) {
      const int32_t bias_type = CUDA_R_16F;
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_, sizeof(bias_)));
    }
    cublasLtMatmulHeuristicResult_t results[kMaxCandidates];
    const int count = cublaslt_candidates(services.cublaslt(), desc_, a_, b_, d_, kLibraryWorkspace, kMaxCandidates, results);
    for (int i = 0; i < count; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS) {
        algos_.push_back(results[i].algo);
        algo_workspace_.push_back(results[i].workspaceSize);
      }
    if (algos_.empty()) continue;
    library_act_ = v.act || spec_.act.none();
    library_bias_ = bias_here || !has_bias;
    break;
  }
  if (algos_.empty()) {
    if (desc_) cublasLtMatmulDescDestroy(desc_), desc_ = nullptr;
    for (auto l : {a_, b_, d_})
      if (l) cublasLtMatrixLayoutDestroy(l);
    a_ = b_ = d_ = nullptr;
    throw Error(ErrorKind::kUnsupported, "cuBLASLt has no FP8 algorithm with per-channel scales for this product");
  }
  finish_ = !library_act_ || !library_bias_ || spec_.y_scale > 0.f;
}

Fp8Gemm::~Fp8Gemm() {
  if (desc_) cublasLtMatmulDescDestroy(desc_);
  for (auto l : {a_, b_, d_})
    if (l) cublasLtMatrixLayoutDestroy(l);
}

size_t Fp8Gemm::library_workspace() const { return aligned(algo_workspace_[static_cast<size_t>(selected_)]); }

size_t Fp8Gemm::workspace_bytes() const {
  size_t bytes = library_workspace();
  if (spec_.y_scale > 0.f) bytes += aligned(static_cast<size_t>(spec_.m * spec_.n) * sizeof(__half));
  return bytes;
}

void Fp8Gemm::run(cublasLtHandle_t handle, const void* x, const void* z, void* y, void* workspace, cudaStream_t stream) const {
  // A float16 Y is cuBLASLt's D; an FP8 Y is requantized from a float16 D in the workspace.
  void* d = spec_.y_scale > 0.f ? static_cast<char*>(workspace) + library_workspace() : y;
  const float alpha = 1.f, beta = spec_.has_z ? 1.f : 0.f;
  const void* c = spec_.has_z ? z : d;
  KILN_CUBLAS_CHECK(cublasLtMatmul(handle, desc_, &alpha, weights_, a_, x, b_, &beta, c, d_, d, d_,
                                   &algos_[static_cast<size_t>(selected_)], workspace, library_workspace(), stream));
  if (!finish_) return;
  const ir::Activation act = library_act_ ? ir::Activation{} : spec_.act;
  const float* bias = library_bias_ ? nullptr : finish_bias_;
  const int64_t elements = spec_.m * spec_.n;
  if (spec_.y_scale > 0.f) {
    launch_epilogue_to_fp8(d, y, bias, elements, spec_.n, act, 1.f / spec_.y_scale, stream);
  } else {
    launch_epilogue(d, bias, nullptr, elements, spec_.n, 1, DType::kFloat16, act, stream);
  }
}

std::string Fp8Gemm::name() const {
  std::ostringstream s;
  s << "cublasLt:fp8 algo#" << selected_;
  if (finish_) s << (spec_.y_scale > 0.f ? "+requantize" : "+epilogue");
  return s.str();
}

}  // namespace kiln::cuda
