// Conv, kiln::FusedConv and ConvTranspose on cuDNN.
//
// 2-D convolutions of float16 / tf32 builds run channels-last (NHWC), where cuDNN's tensor
// core kernels are fastest; strict fp32 builds and 1-D / 3-D convolutions run on row-major
// (NCHW) tensors. The epilogue of FusedConv (bias, residual Z, activation) runs either inside
// cuDNN (cudnnConvolutionBiasActivationForward, for ReLU and identity) or as one kernel after
// the convolution; the builder times every cuDNN algorithm in both forms on this GPU and keeps
// the fastest (the tactic), remembered in the timing cache.
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/conv_graph.h"
#include "cuda/kernels/depthwise.h"
#include "cuda/kernels/epilogue.h"
#include "cuda/kernels/patches.h"
#include "cuda/layers/gemm.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/engine.h"
#include "ir/activation.h"
#include "ops/conv_geometry.h"

namespace kiln::cuda {

namespace {

// --- checking tactics ---------------------------------------------------------------------------
// A candidate that is fast but wrong (cuDNN engines have had bugs at unusual shapes) must not
// win: every candidate's output for the first images (all of them up to 64M output
// elements) is compared with a direct convolution in float32, and one that differs beyond
// the precision's tolerance is dropped.

struct RefGeometry {
  int c, h, w, k, oh, ow, r, s, pad_h, pad_w, stride_h, stride_w, dil_h, dil_w, cg, kg;
  int images;  // how many images (from the first) to check
  bool nhwc;
};

template <class T>
__global__ void reference_conv_kernel(const T* __restrict__ x, const T* __restrict__ wt, const float* __restrict__ bias,
                                      const T* __restrict__ z, float* __restrict__ ref, RefGeometry g,
                                      ir::Activation act) {
  const int per_image = g.k * g.oh * g.ow;
  const int total = per_image * g.images;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int n = i / per_image, j = i % per_image;
    const int k = j / (g.oh * g.ow), oh = (j / g.ow) % g.oh, ow = j % g.ow;
    const T* x_n = x + int64_t(n) * g.c * g.h * g.w;
    const int group = k / g.kg;
    float acc = 0.f;
    for (int cg = 0; cg < g.cg; ++cg) {
      const int c = group * g.cg + cg;
      for (int r = 0; r < g.r; ++r) {
        const int ih = oh * g.stride_h - g.pad_h + r * g.dil_h;
        if (ih < 0 || ih >= g.h) continue;
        for (int s = 0; s < g.s; ++s) {
          const int iw = ow * g.stride_w - g.pad_w + s * g.dil_w;
          if (iw < 0 || iw >= g.w) continue;
          const int64_t xi = g.nhwc ? (int64_t(ih) * g.w + iw) * g.c + c : (int64_t(c) * g.h + ih) * g.w + iw;
          const int64_t wi = g.nhwc ? ((int64_t(k) * g.r + r) * g.s + s) * g.cg + cg : ((int64_t(k) * g.cg + cg) * g.r + r) * g.s + s;
          acc += load_float(x_n, xi) * load_float(wt, wi);
        }
      }
    }
    if (bias) acc += bias[k];
    const int64_t yi = int64_t(n) * per_image +
                       (g.nhwc ? (int64_t(oh) * g.ow + ow) * g.k + k : (int64_t(k) * g.oh + oh) * g.ow + ow);
    if (z) acc += load_float(z, yi);
    ref[yi] = act.apply(acc);
  }
}

template <class T>
__global__ void compare_kernel(const T* __restrict__ y, const float* __restrict__ ref, int n, double* sums) {
  double diff = 0, norm = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const double got = load_float(y, i), want = ref[i];
    diff += (got - want) * (got - want);
    norm += want * want;
    if (!(got == got)) diff += 1e30;  // NaN
  }
  atomicAdd(&sums[0], diff);
  atomicAdd(&sums[1], norm);
}

// Holds the reference output of image 0 and compares candidates with it.
class TacticChecker {
 public:
  TacticChecker(const RefGeometry& g, DType dtype, const void* x, const void* w, const float* bias, const void* z,
                ir::Activation act, double tolerance, cudaStream_t stream)
      : n_(g.k * g.oh * g.ow * g.images), dtype_(dtype), tolerance_(tolerance), stream_(stream) {
    KILN_CUDA_CHECK(cudaMalloc(&ref_, ((sizeof(float) * static_cast<size_t>(n_) + 15) / 16) * 16 + 2 * sizeof(double)));
    sums_ = reinterpret_cast<double*>(reinterpret_cast<char*>(ref_) + ((sizeof(float) * n_ + 15) / 16) * 16);
    if (dtype == DType::kFloat16)
      reference_conv_kernel<__half><<<grid_for(n_), 256, 0, stream>>>(static_cast<const __half*>(x), static_cast<const __half*>(w),
                                                                       bias, static_cast<const __half*>(z), ref_, g, act);
    else
      reference_conv_kernel<float><<<grid_for(n_), 256, 0, stream>>>(static_cast<const float*>(x), static_cast<const float*>(w),
                                                                      bias, static_cast<const float*>(z), ref_, g, act);
    KILN_CUDA_CHECK_LAUNCH();
  }
  ~TacticChecker() { if (ref_) cudaFree(ref_); }
  TacticChecker(const TacticChecker&) = delete;
  TacticChecker& operator=(const TacticChecker&) = delete;

  // The relative L2 error of image 0 of `y` (the candidate's output); sets `ok`.
  double error(const void* y, bool& ok) const {
    KILN_CUDA_CHECK(cudaMemsetAsync(sums_, 0, 2 * sizeof(double), stream_));
    const unsigned blocks = std::min(grid_for(n_), 256u);
    if (dtype_ == DType::kFloat16)
      compare_kernel<__half><<<blocks, 256, 0, stream_>>>(static_cast<const __half*>(y), ref_, n_, sums_);
    else
      compare_kernel<float><<<blocks, 256, 0, stream_>>>(static_cast<const float*>(y), ref_, n_, sums_);
    KILN_CUDA_CHECK_LAUNCH();
    double host[2] = {0, 0};
    KILN_CUDA_CHECK(cudaMemcpyAsync(host, sums_, sizeof(host), cudaMemcpyDeviceToHost, stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const double err = std::sqrt(host[0] / std::max(host[1], 1e-30));
    ok = err <= tolerance_;
    return err;
  }

 private:
  int n_;
  DType dtype_;
  double tolerance_;
  cudaStream_t stream_;
  float* ref_ = nullptr;
  double* sums_ = nullptr;
};

// --- cuDNN descriptors -------------------------------------------------------------------------

cudnnDataType_t cudnn_dtype(DType d) {
  switch (d) {
    case DType::kFloat32: return CUDNN_DATA_FLOAT;
    case DType::kFloat16: return CUDNN_DATA_HALF;
    case DType::kBFloat16: return CUDNN_DATA_BFLOAT16;
    default: throw Error(ErrorKind::kUnsupported, "cuDNN convolutions take float32/float16/bfloat16, not " + to_string(d));
  }
}

// A tensor descriptor of rank >= 4 (1-D convs get a unit H dim). NHWC uses cuDNN's format.
struct TensorDescriptor {
  cudnnTensorDescriptor_t desc = nullptr;
  TensorDescriptor(const std::vector<int64_t>& shape4plus, DType dtype, Layout layout) {
    KILN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc));
    std::vector<int> dims(shape4plus.begin(), shape4plus.end());
    if (layout == Layout::kNHWC) {
      KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc, CUDNN_TENSOR_NHWC, cudnn_dtype(dtype), dims[0], dims[1], dims[2], dims[3]));
    } else {
      std::vector<int> strides(dims.size(), 1);
      for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
      KILN_CUDNN_CHECK(cudnnSetTensorNdDescriptor(desc, cudnn_dtype(dtype), static_cast<int>(dims.size()), dims.data(), strides.data()));
    }
  }
  ~TensorDescriptor() { if (desc) cudnnDestroyTensorDescriptor(desc); }
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;
};

struct FilterDescriptor {
  cudnnFilterDescriptor_t desc = nullptr;
  FilterDescriptor(const std::vector<int64_t>& shape4plus, DType dtype, Layout layout) {
    KILN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&desc));
    std::vector<int> dims(shape4plus.begin(), shape4plus.end());
    KILN_CUDNN_CHECK(cudnnSetFilterNdDescriptor(desc, cudnn_dtype(dtype),
                                                layout == Layout::kNHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                                static_cast<int>(dims.size()), dims.data()));
  }
  ~FilterDescriptor() { if (desc) cudnnDestroyFilterDescriptor(desc); }
  FilterDescriptor(const FilterDescriptor&) = delete;
  FilterDescriptor& operator=(const FilterDescriptor&) = delete;
};

struct ConvParams {
  int spatial = 2;
  std::vector<int64_t> x, w, y;  // logical shapes, padded to >= 4 dims (1-D gets H = 1)
  std::vector<int> pads, strides, dilations;
  int64_t group = 1;
  Format format;                 // of x, y (and z)
  Precision precision = Precision::kFp32;
  bool transpose = false;
  bool has_bias = false, has_z = false;
  ir::Activation act;

  // --fp32 on float32 data: FMA math, no tensor cores, and no Winograd (see allowed_algorithm).
  bool strict_fp32() const { return precision == Precision::kFp32 && format.dtype == DType::kFloat32; }

  std::string key() const {
    std::ostringstream s;
    s << (transpose ? "convT" : "conv") << "|x" << shape_to_string(x) << "|w" << shape_to_string(w) << "|g" << group
      << "|p";
    for (int p : pads) s << p << ",";
    s << "|s";
    for (int v : strides) s << v << ",";
    s << "|d";
    for (int v : dilations) s << v << ",";
    s << "|" << format.str() << "|" << to_string(precision) << "|b" << has_bias << "z" << has_z << "|" << act.name();
    return s.str();
  }
};

struct ConvolutionDescriptor {
  cudnnConvolutionDescriptor_t desc = nullptr;
  explicit ConvolutionDescriptor(const ConvParams& p) {
    KILN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&desc));
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;  // float accumulation for every precision
    KILN_CUDNN_CHECK(cudnnSetConvolutionNdDescriptor(desc, static_cast<int>(p.pads.size()), p.pads.data(),
                                                     p.strides.data(), p.dilations.data(), CUDNN_CROSS_CORRELATION,
                                                     compute));
    KILN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(desc, static_cast<int>(p.group)));
    KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(desc, p.strict_fp32() ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
  }
  ~ConvolutionDescriptor() { if (desc) cudnnDestroyConvolutionDescriptor(desc); }
  ConvolutionDescriptor(const ConvolutionDescriptor&) = delete;
  ConvolutionDescriptor& operator=(const ConvolutionDescriptor&) = delete;
};

// Weights in cuDNN's order for the layout (KCRS, or KRSC for NHWC) and the storage dtype.
Tensor filter_for(const Tensor& w, const std::vector<int64_t>& w4, const Format& format) {
  Tensor reshaped = w.reshaped(w4);
  return convert_constant(reshaped, Format{format.dtype, w4.size() == 4 ? format.layout : Layout::kLinear});
}

// A convolution of non-overlapping patches: the patches gathered into the rows of a matrix in
// the workspace, then the matrix product (whose own workspace follows the patches).
class PatchGemmLayer final : public Layer {
 public:
  PatchGemmLayer(const PatchGeometry& g, DType dtype, std::unique_ptr<Layer> gemm)
      : g_(g), element_bytes_(element_size(dtype)), gemm_(std::move(gemm)) {
    patch_bytes_ = ((static_cast<size_t>(g_.rows() * g_.row_elements()) * element_bytes_ + 255) / 256) * 256;
  }
  void enqueue(const LayerIO& io, cudaStream_t stream) const override {
    launch_gather_patches_nhwc(io.inputs[0], io.workspace, g_, element_bytes_, stream);
    LayerIO product = io;
    product.inputs[0] = io.workspace;
    product.workspace = gemm_->workspace_bytes() ? static_cast<char*>(io.workspace) + patch_bytes_ : nullptr;
    gemm_->enqueue(product, stream);
  }
  size_t workspace_bytes() const override { return patch_bytes_ + gemm_->workspace_bytes(); }
  std::string tactic() const override { return "patches+" + gemm_->tactic(); }

 private:
  PatchGeometry g_;
  size_t element_bytes_;
  size_t patch_bytes_ = 0;
  std::unique_ptr<Layer> gemm_;
};

class ConvLayer final : public Layer {
 public:
  ConvLayer(ConvParams p, BuildServices& services, const Tensor& weights, const Tensor* bias)
      : p_(std::move(p)),
        x_desc_(p_.x, p_.format.dtype, p_.format.layout),
        y_desc_(p_.y, p_.format.dtype, p_.format.layout),
        w_desc_(p_.w, p_.format.dtype, p_.format.layout),
        conv_desc_(p_),
        bias_desc_(bias_shape(p_), p_.format.dtype, Layout::kLinear),
        y_spec_{p_.y, p_.format},
        epilogue_act_(p_.act),
        tactics_(services.tactics()) {
    if (p_.transpose) {
      // backward-data's "filter" is the forward filter: [C_in, K/g, R, S] in NCHW order.
      Tensor w = convert_constant(weights.reshaped(p_.w), Format{p_.format.dtype, Layout::kLinear});
      if (p_.format.layout == Layout::kNHWC) w = convert_constant(w.reshaped(p_.w), Format{p_.format.dtype, Layout::kNHWC});
      weights_ = services.upload(w.raw(), w.nbytes());
    } else {
      Tensor w = filter_for(weights, p_.w, p_.format);
      weights_ = services.upload(w.raw(), w.nbytes());
    }
    const int64_t k = p_.y[1];
    std::vector<float> b32(static_cast<size_t>(k), 0.f);
    if (bias) std::memcpy(b32.data(), bias->data<float>(), sizeof(float) * static_cast<size_t>(k));
    bias32_ = static_cast<const float*>(services.upload(b32.data(), b32.size() * sizeof(float)));
    Tensor bstore = convert_constant(Tensor::from_vector<float>({k}, b32), Format{p_.format.dtype, Layout::kLinear});
    bias_storage_ = services.upload(bstore.raw(), bstore.nbytes());
    weights_host_ = weights;
    bias_host_ = b32;
    if (depthwise_eligible()) {
      // kiln's depthwise kernel reads float32 weights tap-major: [R*S][C].
      const int64_t c = p_.y[1], taps = p_.w[2] * p_.w[3];
      const float* src = weights.data<float>();
      std::vector<float> tap_major(static_cast<size_t>(c * taps));
      for (int64_t k = 0; k < c; ++k)
        for (int64_t t = 0; t < taps; ++t) tap_major[static_cast<size_t>(t * c + k)] = src[k * taps + t];
      depthwise_weights_ = static_cast<const float*>(services.upload(tap_major.data(), tap_major.size() * sizeof(float)));
    }
    KILN_CUDNN_CHECK(cudnnCreateActivationDescriptor(&relu_));
    KILN_CUDNN_CHECK(cudnnSetActivationDescriptor(relu_, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    KILN_CUDNN_CHECK(cudnnCreateActivationDescriptor(&identity_));
    KILN_CUDNN_CHECK(cudnnSetActivationDescriptor(identity_, CUDNN_ACTIVATION_IDENTITY, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    choose_tactic(services);
  }

  ~ConvLayer() override {
    if (relu_) cudnnDestroyActivationDescriptor(relu_);
    if (identity_) cudnnDestroyActivationDescriptor(identity_);
  }

  void enqueue(const LayerIO& io, cudaStream_t stream) const override {
    const void* z = io.inputs.size() > 3 ? io.inputs[3] : nullptr;
    if (gemm_) {
      gemm_->enqueue(io, stream);
      return;
    }
    if (depthwise_tile_) {
      run_depthwise(io.inputs[0], z, io.outputs[0], *depthwise_tile_, stream);
      return;
    }
    if (graph_) {
      KILN_CUDNN_CHECK(cudnnSetStream(io.cudnn, stream));
      graph_->execute(io.cudnn, io.inputs[0], weights_, bias_storage_, z, io.outputs[0], io.workspace);
      return;
    }
    run(io.cudnn, io.inputs[0], z, io.outputs[0], io.workspace, stream, fused_, algo_, workspace_);
  }
  size_t workspace_bytes() const override { return workspace_; }
  bool uses_cudnn() const override { return !gemm_ && !depthwise_tile_; }
  std::string tactic() const override {
    if (gemm_) return "gemm(" + gemm_->tactic() + ")";
    if (depthwise_tile_) return "kernel:depthwise_nhwc " + depthwise_tile_->name();
    if (graph_) return "cudnn-graph:" + graph_->engine_name() + " #" + std::to_string(graph_->selected());
    return std::string("cudnn:") + (p_.transpose ? "bwd-data" : fused_ ? "fused" : "conv+epilogue") +
           " algo=" + std::to_string(algo_);
  }

 private:
  // [1, K, 1, 1]: one bias per output channel.
  static std::vector<int64_t> bias_shape(const ConvParams& p) {
    std::vector<int64_t> shape(p.y.size(), 1);
    shape[1] = p.y[1];
    return shape;
  }
  bool epilogue_needed() const { return p_.has_bias || p_.has_z || !p_.act.none(); }

  void run(cudnnHandle_t handle, const void* x, const void* z, void* y, void* ws, cudaStream_t stream, bool fused,
           int algo, size_t ws_bytes) const {
    KILN_CUDNN_CHECK(cudnnSetStream(handle, stream));
    const float one = 1.f, zero = 0.f;
    if (p_.transpose) {
      KILN_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, &one, w_desc_.desc, weights_, x_desc_.desc, x, conv_desc_.desc,
                                                    static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws, ws_bytes,
                                                    &zero, y_desc_.desc, y));
      if (p_.has_bias) launch_channel_epilogue(y, bias32_, nullptr, y_spec_, ir::Activation{}, stream);
      return;
    }
    if (fused) {
      const float alpha2 = z ? 1.f : 0.f;
      KILN_CUDNN_CHECK(cudnnConvolutionBiasActivationForward(
          handle, &one, x_desc_.desc, x, w_desc_.desc, weights_, conv_desc_.desc,
          static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws, ws_bytes, &alpha2, y_desc_.desc, z ? z : y,
          bias_desc_.desc, bias_storage_, p_.act.none() ? identity_ : relu_, y_desc_.desc, y));
      return;
    }
    KILN_CUDNN_CHECK(cudnnConvolutionForward(handle, &one, x_desc_.desc, x, w_desc_.desc, weights_, conv_desc_.desc,
                                             static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws, ws_bytes, &zero,
                                             y_desc_.desc, y));
    if (epilogue_needed()) launch_channel_epilogue(y, p_.has_bias ? bias32_ : nullptr, z, y_spec_, epilogue_act_, stream);
  }

  struct Candidate { bool fused; int algo; size_t workspace; bool deterministic = true; };

  std::vector<Candidate> candidates(BuildServices& services) const {
    std::vector<Candidate> out;
    const size_t limit = size_t{1} << 30;
    cudnnHandle_t handle = services.cudnn();
    if (p_.transpose) {
      int count = 0;
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      KILN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, w_desc_.desc, x_desc_.desc, conv_desc_.desc,
                                                                   y_desc_.desc, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                                   &count, perf));
      for (int i = 0; i < count; ++i)
        if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit && allowed_algorithm(perf[i].algo))
          out.push_back({false, static_cast<int>(perf[i].algo), perf[i].memory, perf[i].determinism == CUDNN_DETERMINISTIC});
      return deterministic_if_any(std::move(out));
    }
    int count = 0;
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    KILN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, x_desc_.desc, w_desc_.desc, conv_desc_.desc,
                                                            y_desc_.desc, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf));
    const bool fusable = p_.act.none() || p_.act.kind == ir::ActivationKind::kRelu;
    for (int i = 0; i < count; ++i) {
      if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > limit || !allowed_algorithm(perf[i].algo)) continue;
      const int algo = static_cast<int>(perf[i].algo);
      const bool deterministic = perf[i].determinism == CUDNN_DETERMINISTIC;
      out.push_back({false, algo, perf[i].memory, deterministic});
      // cuDNN's fused call takes identity only with IMPLICIT_PRECOMP_GEMM.
      if (fusable && (p_.act.kind == ir::ActivationKind::kRelu || perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM))
        out.push_back({true, algo, perf[i].memory, deterministic});
    }
    return deterministic_if_any(std::move(out));
  }

  // A nondeterministic algorithm (atomic sums, e.g. backward-data ALGO_0) repeats its result
  // while the GPU runs nothing else and differs from it beside other work: such algorithms are
  // candidates only where no deterministic one can run the convolution.
  static std::vector<Candidate> deterministic_if_any(std::vector<Candidate> all) {
    std::vector<Candidate> kept;
    for (const Candidate& c : all)
      if (c.deterministic) kept.push_back(c);
    return kept.empty() ? all : kept;
  }

  // Strict fp32 keeps each convolution as exact as float32 accumulation. cuDNN's Winograd
  // algorithms lose about ten times that in their transforms (relative error 1.5e-6 to 5e-6 per
  // 3x3 layer against 0 to 4e-7 for implicit GEMM and FFT, measured on an H200), and a deep
  // network amplifies it: ResNet-50 with them landed at 1e-4 from the CPU engine, twice
  // PyTorch fp32's distance (docs/design/tactic-timing.md, "Strict fp32 refuses Winograd").
  // --tf32 and fp16 may use them.
  // `algo`: a forward algorithm, or a backward-data one for a transposed convolution.
  bool allowed_algorithm(int algo) const {
    if (!p_.strict_fp32()) return true;
    if (p_.transpose)
      return algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD && algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
    return algo != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD && algo != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
  }

  static std::string encode(const Candidate& c) {
    return std::string(c.fused ? "fused" : "split") + ":" + std::to_string(c.algo) + ":" + std::to_string(c.workspace);
  }

  // The graph API form of this convolution, when it has one (2-D, float16 channels-last).
  bool graph_eligible() const {
    if (!tactics_.cudnn_graphs) return false;
    return !p_.transpose && p_.spatial == 2 && p_.format.dtype == DType::kFloat16 && p_.format.layout == Layout::kNHWC &&
           conv_graph_supports(p_.act);
  }
  std::unique_ptr<ConvGraph> make_graph(BuildServices& services) const {
    ConvGraphSpec g;
    g.x = p_.x;
    g.w = p_.w;
    g.y = p_.y;
    for (int v : p_.pads) g.pads.push_back(v);
    for (int v : p_.strides) g.strides.push_back(v);
    for (int v : p_.dilations) g.dilations.push_back(v);
    g.nhwc = true;
    g.io_type = CUDNN_DATA_HALF;
    g.has_bias = p_.has_bias;
    g.has_z = p_.has_z;
    g.act = p_.act;
    return std::make_unique<ConvGraph>(services.cudnn(), g);
  }

  // On channels-last data, a 1x1 convolution with stride 1 and no padding is one matrix
  // product: Y[N*H*W, K] = X[N*H*W, C] W[K, C]^T, with bias, residual and activation in
  // cuBLASLt's epilogue. So is one whose patches do not overlap (stride at least the kernel, no
  // padding or dilation: a patch embedding, a strided 1x1 shortcut) once its patches are
  // gathered into rows (kernels/patches.h): Y[N*OH*OW, K] = P[N*OH*OW, R*S*C] W[K, R*S*C]^T.
  bool gemm_eligible() const {
    if (!tactics_.conv_as_gemm) return false;
    if (p_.transpose || p_.spatial != 2 || p_.group != 1 || p_.format.layout != Layout::kNHWC) return false;
    for (size_t i = 0; i < p_.pads.size(); ++i)
      if (p_.pads[i] != 0 || p_.dilations[i] != 1 || p_.strides[i] < p_.w[2 + i]) return false;
    return true;
  }
  bool gathers_patches() const { return p_.w[2] != 1 || p_.w[3] != 1 || p_.strides[0] != 1 || p_.strides[1] != 1; }
  std::unique_ptr<Layer> make_gemm(BuildServices& services) const {
    GemmSpec g;
    g.m = p_.y[0] * p_.y[2] * p_.y[3];
    g.n = p_.y[1];
    g.k = p_.x[1] * p_.w[2] * p_.w[3];
    g.trans_b = true;
    g.dtype = p_.format.dtype;
    g.precision = p_.precision;
    if (p_.has_bias) g.bias = bias_host_;
    g.addend_input = p_.has_z ? 3 : -1;
    g.act = p_.act;
    if (!gathers_patches()) return make_gemm_layer(g, weights_host_, services);
    // The filter in the patch rows' order: [K][R][S][C].
    const int64_t k = p_.w[0], c = p_.w[1], taps = p_.w[2] * p_.w[3];
    std::vector<float> krsc(static_cast<size_t>(k * taps * c));
    const float* kcrs = weights_host_.data<float>();
    for (int64_t o = 0; o < k; ++o)
      for (int64_t i = 0; i < c; ++i)
        for (int64_t t = 0; t < taps; ++t) krsc[static_cast<size_t>((o * taps + t) * c + i)] = kcrs[(o * c + i) * taps + t];
    PatchGeometry patches{p_.x[0], p_.x[2], p_.x[3], p_.x[1], p_.y[2], p_.y[3],
                          p_.w[2], p_.w[3], p_.strides[0], p_.strides[1]};
    return std::make_unique<PatchGemmLayer>(patches, p_.format.dtype,
                                            make_gemm_layer(g, Tensor::from_vector<float>({k, taps * c}, krsc), services));
  }

  // kiln's own kernel for depthwise convolutions (one filter per channel) in float16 NHWC.
  DepthwiseGeometry depthwise_geometry() const {
    return DepthwiseGeometry{static_cast<int>(p_.x[0]), static_cast<int>(p_.x[1]), static_cast<int>(p_.x[2]),
                             static_cast<int>(p_.x[3]), static_cast<int>(p_.y[2]), static_cast<int>(p_.y[3]),
                             static_cast<int>(p_.w[2]), static_cast<int>(p_.w[3]), p_.pads[0], p_.pads[1],
                             p_.strides[0], p_.strides[1], p_.dilations[0], p_.dilations[1]};
  }
  bool depthwise_eligible() const {
    if (!tactics_.depthwise_kernel) return false;
    return !p_.transpose && p_.spatial == 2 && p_.format.dtype == DType::kFloat16 &&
           p_.format.layout == Layout::kNHWC && p_.group == p_.x[1] && p_.y[1] == p_.x[1] && p_.w[1] == 1 &&
           depthwise_supported(depthwise_geometry());
  }
  // The tiles kiln's depthwise kernel has for this convolution (each one is timed).
  std::vector<DepthwiseTile> depthwise_tiles() const { return kiln::cuda::depthwise_tiles(depthwise_geometry()); }
  void run_depthwise(const void* x, const void* z, void* y, DepthwiseTile tile, cudaStream_t stream) const {
    launch_depthwise_nhwc(static_cast<const __half*>(x), depthwise_weights_, p_.has_bias ? bias32_ : nullptr,
                          static_cast<const __half*>(z), static_cast<__half*>(y), depthwise_geometry(), epilogue_act_,
                          tile, stream);
  }

  // The checker for this convolution (2-D and 1-D forward convolutions), or nullptr.
  std::unique_ptr<TacticChecker> make_checker(const void* x, const void* z, cudaStream_t stream) const {
    if (p_.transpose || p_.x.size() != 4) return nullptr;
    RefGeometry g{};
    g.c = static_cast<int>(p_.x[1]);
    g.h = static_cast<int>(p_.x[2]);
    g.w = static_cast<int>(p_.x[3]);
    g.k = static_cast<int>(p_.y[1]);
    g.oh = static_cast<int>(p_.y[2]);
    g.ow = static_cast<int>(p_.y[3]);
    g.r = static_cast<int>(p_.w[2]);
    g.s = static_cast<int>(p_.w[3]);
    g.pad_h = p_.pads[0];
    g.pad_w = p_.pads[1];
    g.stride_h = p_.strides[0];
    g.stride_w = p_.strides[1];
    g.dil_h = p_.dilations[0];
    g.dil_w = p_.dilations[1];
    g.cg = static_cast<int>(p_.w[1]);
    g.kg = static_cast<int>(p_.y[1] / p_.group);
    g.nhwc = p_.format.layout == Layout::kNHWC;
    const int64_t per_image = p_.y[1] * p_.y[2] * p_.y[3];
    g.images = static_cast<int>(std::clamp<int64_t>((int64_t{1} << 26) / std::max<int64_t>(per_image, 1), 1, p_.x[0]));
    // Strict fp32's candidates land within 4e-7 of the reference (implicit GEMM, FFT); 1e-5
    // leaves room for long sums and still refuses anything of Winograd's error or worse.
    const double tolerance = p_.format.dtype == DType::kFloat16 ? 2e-2 : p_.strict_fp32() ? 1e-5 : 1e-2;
    return std::make_unique<TacticChecker>(g, p_.format.dtype, x, weights_, p_.has_bias ? bias32_ : nullptr,
                                           p_.has_z ? z : nullptr, epilogue_act_, tolerance, stream);
  }

  void choose_tactic(BuildServices& services) {
    const std::string key = p_.key();
    const bool log = tactics_.log_candidates;  // every candidate's time, for tuning
    if (auto cached = services.cached_tactic(key)) {
      try {
        if (cached->rfind("graph:", 0) == 0) {
          auto g = make_graph(services);
          if (g->select(services.cudnn(), std::atoi(cached->c_str() + 6))) {
            workspace_ = g->workspace_bytes();
            graph_ = std::move(g);
            return;
          }
        } else if (cached->rfind("depthwise:", 0) == 0 && depthwise_eligible()) {
          // "depthwise:" + DepthwiseTile::name(); anything else (an older binary's entry) is timed again.
          for (DepthwiseTile tile : depthwise_tiles())
            if (*cached == "depthwise:" + tile.name()) {
              depthwise_tile_ = tile;
              return;
            }
        } else if (*cached == "gemm" && gemm_eligible()) {
          gemm_ = make_gemm(services);
          workspace_ = gemm_->workspace_bytes();
          return;
        } else {
          char kind[16] = {};
          int algo = 0;
          unsigned long long ws = 0;
          // A cache written before strict fp32 refused Winograd may still name it: time again.
          // Backward-data ALGO_0 sums with atomics: time again, where a deterministic one may win.
          if (std::sscanf(cached->c_str(), "%15[a-z]:%d:%llu", kind, &algo, &ws) == 3 && allowed_algorithm(algo) &&
              !(p_.transpose && algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0)) {
            fused_ = std::string(kind) == "fused";
            algo_ = algo;
            workspace_ = static_cast<size_t>(ws);
            return;
          }
        }
      } catch (const Error&) {
        // a cached tactic this build cannot use: time again
      }
    }
    std::vector<Candidate> list = candidates(services);
    if (list.empty()) throw Error(ErrorKind::kUnsupported, "cuDNN has no algorithm for this convolution (" + key + ")");
    const LayerIO& io = services.scratch_io();
    const void* z = io.inputs.size() > 3 ? io.inputs[3] : nullptr;
    float best = 1e30f;
    std::string last_error;
    std::unique_ptr<TacticChecker> checker = make_checker(io.inputs[0], z, services.stream());
    // Times one candidate; when it is the fastest so far, runs it once more on a poisoned
    // output (all bits set: NaN) and compares with the direct convolution. The poison matters:
    // an engine that leaves part of the output unwritten would otherwise pass on what an
    // earlier candidate wrote there (suspected of a cuDNN graph engine for depthwise convs).
    // With TacticOptions::log_candidates every candidate is checked, so that the log shows each one's error.
    auto consider = [&](const std::string& what, const std::function<void(cudaStream_t)>& launch) {
      const float ms = services.time_ms(launch);
      const bool fastest = ms < best;
      bool ok = true;
      double err = 0;
      if (checker && (fastest || log)) {
        KILN_CUDA_CHECK(cudaMemsetAsync(io.outputs[0], 0xFF, y_spec_.bytes(), services.stream()));
        launch(services.stream());
        err = checker->error(io.outputs[0], ok);
      }
      if (log) {
        char line[160];
        std::snprintf(line, sizeof line, " %.4f ms, relative error %.3g%s", ms, err, ok ? "" : " (rejected)");
        services.log("  tactic " + key + ": " + what + line);
      }
      if (!fastest) return false;
      if (!ok) {
        last_error = what + " gave wrong results (relative error " + std::to_string(err) + ")";
        return false;
      }
      best = ms;
      return true;
    };
    enum class Winner { kNone, kLegacy, kGraph, kGemm, kDepthwise } winner = Winner::kNone;
    std::string choice;
    for (const Candidate& c : list) {
      void* ws = c.workspace ? services.scratch(c.workspace) : nullptr;
      try {
        if (consider("legacy " + encode(c), [&](cudaStream_t s) {
              run(services.cudnn(), io.inputs[0], z, io.outputs[0], ws, s, c.fused, c.algo, c.workspace);
            })) {
          winner = Winner::kLegacy;
          fused_ = c.fused;
          algo_ = c.algo;
          workspace_ = c.workspace;
          choice = encode(c);
        }
      } catch (const Error& e) {
        last_error = e.what();  // this algorithm refused these parameters at run time
        cudaGetLastError();
      }
    }
    // The graph API's engines, timed against the best legacy algorithm.
    std::unique_ptr<ConvGraph> graph;
    int graph_index = -1;
    if (graph_eligible()) {
      try {
        graph = make_graph(services);
        const int tried = std::min(graph->candidate_count(), kGraphCandidates);
        for (int i = 0; i < tried; ++i) {
          if (!graph->select(services.cudnn(), i) || graph->workspace_bytes() > (size_t{1} << 30)) continue;
          void* ws = graph->workspace_bytes() ? services.scratch(graph->workspace_bytes()) : nullptr;
          try {
            if (consider("graph #" + std::to_string(i) + " " + graph->engine_name(), [&](cudaStream_t s) {
                  KILN_CUDNN_CHECK(cudnnSetStream(services.cudnn(), s));
                  graph->execute(services.cudnn(), io.inputs[0], weights_, bias_storage_, z, io.outputs[0], ws);
                })) {
              winner = Winner::kGraph;
              graph_index = i;
            }
          } catch (const Error& e) {
            last_error = e.what();
            cudaGetLastError();
          }
        }
      } catch (const Error& e) {
        last_error = e.what();  // cuDNN refused the graph: the legacy tactic stands
      }
    }
    // cuBLASLt for 1x1 convolutions and non-overlapping patches.
    std::unique_ptr<Layer> gemm;
    if (gemm_eligible()) {
      try {
        gemm = make_gemm(services);
        LayerIO gio = io;
        gio.workspace = services.scratch(gemm->workspace_bytes());
        if (consider("gemm " + gemm->tactic(), [&](cudaStream_t s) { gemm->enqueue(gio, s); })) winner = Winner::kGemm;
      } catch (const Error& e) {
        last_error = e.what();
        if (log) services.log("  tactic " + key + ": gemm failed: " + e.what());
        cudaGetLastError();
      }
    }
    // kiln's depthwise kernel, at each tile of output pixels per thread it has for this geometry.
    DepthwiseTile depthwise_tile;
    if (depthwise_eligible()) {
      for (DepthwiseTile tile : depthwise_tiles()) {
        try {
          if (consider("kernel depthwise " + tile.name(),
                       [&](cudaStream_t s) { run_depthwise(io.inputs[0], z, io.outputs[0], tile, s); })) {
            winner = Winner::kDepthwise;
            depthwise_tile = tile;
          }
        } catch (const Error& e) {
          last_error = e.what();
          cudaGetLastError();
        }
      }
    }
    switch (winner) {
      case Winner::kNone:
        throw Error(ErrorKind::kUnsupported, "no cuDNN algorithm ran this convolution correctly: " + last_error);
      case Winner::kGemm:
        gemm_ = std::move(gemm);
        workspace_ = gemm_->workspace_bytes();
        services.record_tactic(key, "gemm");
        break;
      case Winner::kGraph:
        // select() hands back the plan already finalized and timed for this candidate.
        if (!graph->select(services.cudnn(), graph_index))
          throw Error(ErrorKind::kDevice, "cuDNN engine " + std::to_string(graph_index) + " failed to finalize again (" + key + ")");
        graph->drop_other_plans();
        workspace_ = graph->workspace_bytes();
        graph_ = std::move(graph);
        services.record_tactic(key, "graph:" + std::to_string(graph_index));
        break;
      case Winner::kLegacy:
        services.record_tactic(key, choice);
        break;
      case Winner::kDepthwise:
        depthwise_tile_ = depthwise_tile;
        workspace_ = 0;
        services.record_tactic(key, "depthwise:" + depthwise_tile.name());
        break;
    }
    if (log) {
      char ms[32];
      std::snprintf(ms, sizeof ms, "%.4f ms", best);
      services.log("  tactic " + key + ": chose " + tactic() + " (" + ms + ")");
    }
  }

  ConvParams p_;
  TensorDescriptor x_desc_, y_desc_;
  FilterDescriptor w_desc_;
  ConvolutionDescriptor conv_desc_;
  TensorDescriptor bias_desc_;
  TensorSpec y_spec_;
  ir::Activation epilogue_act_;
  TacticOptions tactics_;  // the build's (BuildServices::tactics)
  cudnnActivationDescriptor_t relu_ = nullptr, identity_ = nullptr;
  const void* weights_ = nullptr;
  const float* bias32_ = nullptr;
  const void* bias_storage_ = nullptr;
  bool fused_ = false;
  int algo_ = 0;
  size_t workspace_ = 0;
  std::unique_ptr<ConvGraph> graph_;  // set when a graph-API engine won
  std::unique_ptr<Layer> gemm_;       // set when cuBLASLt won (1x1 convolutions, patches)
  std::optional<DepthwiseTile> depthwise_tile_;  // set when kiln's depthwise kernel won
  const float* depthwise_weights_ = nullptr;
  Tensor weights_host_;               // float32 [K, C/g, R, S], for the GEMM form
  std::vector<float> bias_host_;
  static constexpr int kGraphCandidates = 8;
};

// --- lowering ----------------------------------------------------------------------------------

struct Lowering {
  ConvParams params;
  std::string why;  // "" when supported
};

Lowering plan_conv(const LayerRequest& r, bool transpose) {
  Lowering l;
  ConvParams& p = l.params;
  const ir::Node& node = r.node;
  if (!r.has_input(0) || !r.has_input(1)) { l.why = "X and W are required"; return l; }
  if (r.input_dtypes[0] != DType::kFloat32) { l.why = "only float32 models are supported (got " + to_string(r.input_dtypes[0]) + ")"; return l; }
  if (!r.is_constant(1)) { l.why = "the weights W must be a constant"; return l; }
  if (r.has_input(2) && !r.is_constant(2)) { l.why = "the bias B must be a constant"; return l; }
  const std::vector<int64_t>& x = r.input_shape(0);
  const std::vector<int64_t>& w = r.constants[1]->shape();
  p.spatial = static_cast<int>(x.size()) - 2;
  if (p.spatial < 1 || p.spatial > 3) { l.why = std::to_string(p.spatial) + "-D convolutions are not supported"; return l; }
  std::vector<int64_t> wk(w.begin() + 2, w.end()), in(x.begin() + 2, x.end());
  ir::ConvGeometry g;
  try {
    g = ir::conv_geometry(node, p.spatial, wk, in, transpose);
  } catch (const Error& e) {
    l.why = e.message();
    return l;
  }
  for (int i = 0; i < p.spatial; ++i) {
    if (g.pad_begin[i] != g.pad_end[i]) {
      l.why = "asymmetric padding (" + std::to_string(g.pad_begin[i]) + " before, " + std::to_string(g.pad_end[i]) +
              " after) is not supported on the GPU yet";
      return l;
    }
  }
  if (transpose) {
    for (int i = 0; i < p.spatial; ++i) {
      int64_t natural = g.strides[i] * (x[2 + i] - 1) + g.effective_kernel(i) - g.pad_begin[i] - g.pad_end[i];
      int64_t extra = r.output_shapes[0][2 + i] - natural;
      if (extra < 0 || extra >= g.strides[i]) {
        l.why = "this ConvTranspose output size needs pads cuDNN cannot express";
        return l;
      }
    }
  }
  p.group = g.group;
  p.transpose = transpose;
  p.precision = r.precision;
  p.has_bias = r.has_input(2);
  p.has_z = node.op == "FusedConv" && r.has_input(3);
  if (node.op == "FusedConv") p.act = ir::Activation::from_node(node);
  const DType storage = r.float_storage();
  const bool nhwc = p.spatial == 2 && storage == DType::kFloat16;
  p.format = Format{storage, nhwc ? Layout::kNHWC : Layout::kLinear};
  // 1-D convs run as 2-D with H = 1.
  auto widen = [&](std::vector<int64_t> s) {
    if (p.spatial == 1) s.insert(s.begin() + 2, 1);
    return s;
  };
  p.x = widen(x);
  p.w = widen(w);
  p.y = widen(r.output_shapes[0]);
  for (int i = 0; i < p.spatial; ++i) {
    p.pads.push_back(static_cast<int>(g.pad_begin[i]));
    p.strides.push_back(static_cast<int>(g.strides[i]));
    p.dilations.push_back(static_cast<int>(g.dilations[i]));
  }
  if (p.spatial == 1) {
    p.pads.insert(p.pads.begin(), 0);
    p.strides.insert(p.strides.begin(), 1);
    p.dilations.insert(p.dilations.begin(), 1);
  }
  // ConvTranspose runs as cuDNN's backward-data pass of the conv from y to x; the layer
  // keeps our names (x read, y written) and passes them to cuDNN as dy and dx.
  return l;
}

LayerFormats conv_formats(const LayerRequest& r, bool transpose) {
  Lowering l = plan_conv(r, transpose);
  LayerFormats f;
  f.inputs.resize(r.inputs.size());
  f.inputs[0] = l.params.format;
  if (r.node.op == "FusedConv" && r.has_input(3)) f.inputs[3] = l.params.format;
  f.outputs = {l.params.format};
  return f;
}

std::unique_ptr<Layer> conv_create(const LayerRequest& r, BuildServices& services, bool transpose) {
  Lowering l = plan_conv(r, transpose);
  if (!l.why.empty()) throw r.node.error(ErrorKind::kUnsupported, l.why);
  const Tensor* bias = r.has_input(2) ? r.constants[2] : nullptr;
  return std::make_unique<ConvLayer>(l.params, services, *r.constants[1], bias);
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(conv) {
  for (const char* op : {"Conv", "FusedConv"}) {
    LayerEntry e;
    e.op = op;
    e.domain = std::string(op) == "FusedConv" ? "kiln" : "";
    e.check = [](const LayerRequest& r) { return plan_conv(r, false).why; };
    e.formats = [](const LayerRequest& r) { return conv_formats(r, false); };
    e.create = [](const LayerRequest& r, const LayerFormats&, BuildServices& s) { return conv_create(r, s, false); };
    e.dtypes = "float32, float16 (cuDNN; NHWC for 2-D in fp16)";
    registry.add(std::move(e));
  }
  LayerEntry t;
  t.op = "ConvTranspose";
  t.check = [](const LayerRequest& r) { return plan_conv(r, true).why; };
  t.formats = [](const LayerRequest& r) { return conv_formats(r, true); };
  t.create = [](const LayerRequest& r, const LayerFormats&, BuildServices& s) { return conv_create(r, s, true); };
  t.dtypes = "float32, float16 (cuDNN)";
  registry.add(std::move(t));
}

}  // namespace kiln::cuda
