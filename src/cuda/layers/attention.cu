// ONNX Attention on the GPU: the node attention fusion (passes/fuse_attention.cc) makes of the
// patterns exporters write, and models' own opset-23 Attention without a KV cache.
//
//   logits = scale * Q K^T    cuBLASLt batched products (K read transposed where it is), the
//                             logits stored in the storage type (fp16 under --fp16)
//   P = softmax(logits + mask bias, causal / window masking), in place: one warp per row,
//                             float32 arithmetic, the row in registers up to 1024 keys
//   Y = P V                   cuBLASLt batched products, Y in its final layout
//
// The logits make a round trip through memory (flash attention would keep them on chip): per
// layer 2 * batch * heads * queries * keys elements written and read, as the unfused layers
// did, without their separate scale, mask and key-transpose passes.
//
// Q, K and V are read where they are, in 4-D [batch, heads, seq, size] or 3-D [batch, seq,
// heads * size] layout alike (a head is a matrix with a row stride); Y is written in the
// layout of Q's form. A query head h reads key/value head h / (q_heads / kv_heads). The
// batched products cover as many heads per call as one stride can describe: all of them for
// 4-D inputs without grouping, the heads of one batch element (or of one key/value head)
// otherwise. A row whose keys are all masked gives zeros, as attention_params.h defines.
//
// Float16 engines also time two fused tactics against these products: cuDNN's fused attention
// (attention_sdpa.h; a mask is first written as its float16 bias) and kiln's own kernel
// (flash_attention.h; head size 64, the mask read where it lies), each checked against the
// products' output on the build's random inputs before it may be chosen.
//
// Not on the GPU (check() says so; the model keeps its CPU fallback): a past KV cache,
// nonpad_kv_seqlen, the soft cap, and the present_key/present_value/logits outputs. A graph the
// GPU build specializes has its caches written out first (passes/split_attention_cache.cc).
#include <cublasLt.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "cuda/kernels/attention_sdpa.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/cublaslt.h"
#include "cuda/kernels/flash_attention.h"
#include "cuda/kernels/quantize_elements.cuh"
#include "cuda/runtime/check.h"
#include "ir/sizes.h"
#include "ops/attention_params.h"

namespace kiln::cuda {

namespace {

// The most workspace a product's algorithm may ask for; the layer holds what the chosen ones ask.
constexpr size_t kProductWorkspace = size_t{4} << 20;
constexpr size_t kAlign = 256;
constexpr int kSoftmaxBlock = 256;

size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// The mask's element strides over [batch, q_heads, queries, keys] (0 where it broadcasts) and
// its key count (keys past it are masked).
struct MaskView {
  int64_t stride[4] = {0, 0, 0, 0};
  int64_t keys = 0;
  bool present = false, boolean = false;
};

struct SoftmaxArgs {
  int64_t rows = 0, q_heads = 0, queries = 0, keys = 0;
  MaskView mask;
  bool causal = false;
  int64_t left_window = -1, right_window = -1;
};

// The biased logit of key j of row (b, h, i): -inf where masked.
template <class T, class M>
__device__ __forceinline__ float biased_logit(const T* x, const M* mask, const SoftmaxArgs& a, int64_t mask_base,
                                              int64_t i, int64_t j) {
  if (a.causal && j > i) return -INFINITY;
  const int64_t diff = i - j;
  if (a.left_window >= 0 && diff > a.left_window) return -INFINITY;
  if (a.right_window >= 0 && -diff > a.right_window) return -INFINITY;
  float v = load_float(x, j);
  if (a.mask.present) {
    if (j >= a.mask.keys) return -INFINITY;
    const M m = mask[mask_base + j * a.mask.stride[3]];
    if (a.mask.boolean) {
      if (!m) return -INFINITY;
    } else {
      v += static_cast<float>(m);
    }
  }
  return v;
}

// Softmax in place over rows of logits [batch * q_heads, queries, keys] (storage type T,
// float32 arithmetic), one warp per row. ITEMS > 0: the row is held in registers (keys <=
// 32 * ITEMS; one read, one write); ITEMS == 0: any length, an online max and sum in a first
// pass and the probabilities in a second.
template <class T, class M, int ITEMS>
__global__ void __launch_bounds__(kSoftmaxBlock) attention_softmax_kernel(T* __restrict__ logits,
                                                                          const M* __restrict__ mask, SoftmaxArgs a) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t row = int64_t{blockIdx.x} * (kSoftmaxBlock / 32) + (threadIdx.x >> 5);
  if (row >= a.rows) return;
  const int64_t i = row % a.queries, bh = row / a.queries;
  const int64_t h = bh % a.q_heads, b = bh / a.q_heads;
  T* x = logits + row * a.keys;
  const int64_t mask_base = b * a.mask.stride[0] + h * a.mask.stride[1] + i * a.mask.stride[2];
  float m = -INFINITY, s = 0.f;
  if constexpr (ITEMS > 0) {
    float v[ITEMS];
#pragma unroll
    for (int t = 0; t < ITEMS; ++t) {
      const int64_t j = lane + 32 * t;
      v[t] = j < a.keys ? biased_logit(x, mask, a, mask_base, i, j) : -INFINITY;
      m = fmaxf(m, v[t]);
    }
    m = warp_all(m, [](float a, float b) { return fmaxf(a, b); });
#pragma unroll
    for (int t = 0; t < ITEMS; ++t) {
      v[t] = v[t] == -INFINITY ? 0.f : __expf(v[t] - m);
      s += v[t];
    }
    s = warp_sum(s);
    const float inv = m == -INFINITY ? 0.f : 1.f / s;
#pragma unroll
    for (int t = 0; t < ITEMS; ++t) {
      const int64_t j = lane + 32 * t;
      if (j < a.keys) store_float(x, j, v[t] * inv);
    }
  } else {
    for (int64_t j = lane; j < a.keys; j += 32) {
      const float v = biased_logit(x, mask, a, mask_base, i, j);
      if (v == -INFINITY) continue;
      if (v > m) {
        s = s * __expf(m - v) + 1.f;
        m = v;
      } else {
        s += __expf(v - m);
      }
    }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      const float om = __shfl_xor_sync(0xffffffffu, m, d), os = __shfl_xor_sync(0xffffffffu, s, d);
      const float nm = fmaxf(m, om);
      s = (m == -INFINITY ? 0.f : s * __expf(m - nm)) + (om == -INFINITY ? 0.f : os * __expf(om - nm));
      m = nm;
    }
    const float inv = m == -INFINITY ? 0.f : 1.f / s;
    for (int64_t j = lane; j < a.keys; j += 32) {
      const float v = biased_logit(x, mask, a, mask_base, i, j);
      store_float(x, j, v == -INFINITY ? 0.f : __expf(v - m) * inv);
    }
  }
}

template <class T, class M>
void launch_attention_softmax(T* logits, const M* mask, const SoftmaxArgs& a, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((a.rows + kSoftmaxBlock / 32 - 1) / (kSoftmaxBlock / 32));
  if (a.keys <= 32) attention_softmax_kernel<T, M, 1><<<blocks, kSoftmaxBlock, 0, stream>>>(logits, mask, a);
  else if (a.keys <= 64) attention_softmax_kernel<T, M, 2><<<blocks, kSoftmaxBlock, 0, stream>>>(logits, mask, a);
  else if (a.keys <= 128) attention_softmax_kernel<T, M, 4><<<blocks, kSoftmaxBlock, 0, stream>>>(logits, mask, a);
  else if (a.keys <= 256) attention_softmax_kernel<T, M, 8><<<blocks, kSoftmaxBlock, 0, stream>>>(logits, mask, a);
  else if (a.keys <= 512) attention_softmax_kernel<T, M, 16><<<blocks, kSoftmaxBlock, 0, stream>>>(logits, mask, a);
  else if (a.keys <= 1024) attention_softmax_kernel<T, M, 32><<<blocks, kSoftmaxBlock, 0, stream>>>(logits, mask, a);
  else attention_softmax_kernel<T, M, 0><<<blocks, kSoftmaxBlock, 0, stream>>>(logits, mask, a);
  KILN_CUDA_CHECK_LAUNCH();
}

// The mask as cuDNN's additive float16 bias [bias_batch, bias_heads, queries, keys]: the float
// mask's values (below float16's range: -inf), -inf where a boolean mask hides a key or past the
// mask's keys.
template <class M>
__global__ void sdpa_bias_kernel(const M* __restrict__ mask, __half* __restrict__ bias, MaskView view, int64_t heads,
                                 int64_t queries, int64_t keys, int64_t count) {
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < count; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = e % keys, i = (e / keys) % queries, h = (e / keys / queries) % heads, b = e / keys / queries / heads;
    float v = -INFINITY;
    if (j < view.keys) {
      const M m = mask[b * view.stride[0] + h * view.stride[1] + i * view.stride[2] + j * view.stride[3]];
      if (view.boolean) v = m ? 0.f : -INFINITY;
      else v = static_cast<float>(m);
    }
    bias[e] = __float2half_rn(v);
  }
}

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kFloat16: return CUDA_R_16F;
    default: throw Error(ErrorKind::kUnsupported, "attention products take float32 or float16, not " + to_string(d));
  }
}

// Where an operand's heads lie in Q's, K's, V's or Y's 4-D or 3-D form (offset 0).
ir::HeadLayout form_layout(bool three_d, int64_t heads, int64_t seq, int64_t size) {
  if (three_d) return {0, seq * heads * size, size, heads * size};
  return {0, heads * seq * size, seq * size, size};
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n = checked_mul(n, d, "attention input");
  return n;
}

// The shapes and the operands' layouts: from the form of an Attention node's inputs, or from
// the views a kiln::StridedAttention node gives.
struct AttentionGeometry {
  ir::AttentionShape shape;
  ir::HeadLayout q, k, v, y;
};

AttentionGeometry attention_geometry(const LayerRequest& r) {
  std::string why;
  AttentionGeometry g;
  if (r.node.domain == "kiln") {
    const ir::StridedAttentionGeometry s = ir::strided_attention_geometry(
        r.node, element_count(r.input_shape(0)), element_count(r.input_shape(1)), element_count(r.input_shape(2)), why);
    g = {s.shape, s.q, s.k, s.v, s.y};
  } else {
    g.shape = ir::attention_shape(r.node, r.input_shape(0), r.input_shape(1), r.input_shape(2), {}, why);
    const ir::AttentionShape& a = g.shape;
    g.q = form_layout(a.three_d, a.q_heads, a.q_seq, a.head_size);
    g.k = form_layout(a.three_d, a.kv_heads, a.kv_seq, a.head_size);
    g.v = form_layout(a.three_d, a.kv_heads, a.kv_seq, a.v_head_size);
    g.y = form_layout(a.three_d, a.q_heads, a.q_seq, a.v_head_size);
  }
  if (!why.empty()) throw r.node.error(ErrorKind::kInvalidArgument, why);
  // Axes of size 1: strides cuBLASLt (leading dimensions of at least the rows) and cuDNN
  // (nonzero) take.
  const ir::AttentionShape& a = g.shape;
  ir::settle_unit_axes(g.q, a.batch, a.q_heads, a.q_seq, a.head_size);
  ir::settle_unit_axes(g.k, a.batch, a.kv_heads, a.kv_seq, a.head_size);
  ir::settle_unit_axes(g.v, a.batch, a.kv_heads, a.kv_seq, a.v_head_size);
  ir::settle_unit_axes(g.y, a.batch, a.q_heads, a.q_seq, a.v_head_size);
  return g;
}

// One cuBLASLt product with its layouts, batched with the given strides.
class BatchedProduct {
 public:
  // Column-major D[m, n] = op(A)[m, k] op(B)[k, n], `batch` of them per call.
  BatchedProduct(cublasComputeType_t compute, cudaDataType_t ab_type, cudaDataType_t d_type, bool trans_a, int64_t m,
                 int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldd, int32_t batch, int64_t stride_a,
                 int64_t stride_b, int64_t stride_d, cublasLtHandle_t handle) {
    KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, compute, CUDA_R_32F));
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = CUBLAS_OP_N;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_, ab_type, trans_a ? k : m, trans_a ? m : k, lda));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_, ab_type, k, n, ldb));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d_, d_type, m, n, ldd));
    for (auto [layout, stride] : {std::pair{a_, stride_a}, std::pair{b_, stride_b}, std::pair{d_, stride_d}}) {
      KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
      KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                         sizeof(stride)));
    }
    cublasLtMatmulHeuristicResult_t result{};
    if (cublaslt_candidates(handle, desc_, a_, b_, d_, kProductWorkspace, 1, &result) == 0)
      throw Error(ErrorKind::kUnsupported, "cuBLASLt has no algorithm for an attention product");
    algo_ = result.algo;
    workspace_ = result.workspaceSize;
  }
  BatchedProduct(const BatchedProduct&) = delete;
  BatchedProduct& operator=(const BatchedProduct&) = delete;
  ~BatchedProduct() {
    if (desc_) cublasLtMatmulDescDestroy(desc_);
    for (auto l : {a_, b_, d_})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }

  void run(cublasLtHandle_t handle, float alpha, const void* a, const void* b, void* d, void* ws,
           cudaStream_t stream) const {
    const float beta = 0.f;
    KILN_CUBLAS_CHECK(cublasLtMatmul(handle, desc_, &alpha, a, a_, b, b_, &beta, d, d_, d, d_, &algo_, ws,
                                     workspace_, stream));
  }
  size_t workspace_bytes() const { return workspace_; }

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  size_t workspace_ = 0;
};

// Element offsets of one call's first head in each operand.
struct CallOffsets {
  int64_t q = 0, k = 0, v = 0, y = 0, logits = 0;
};

class AttentionLayer final : public Layer {
 public:
  AttentionLayer(const LayerRequest& r, const LayerFormats& f, BuildServices& services) {
    const AttentionGeometry geometry = attention_geometry(r);
    const ir::AttentionShape& s = geometry.shape;
    const ir::HeadLayout &q = geometry.q, &k = geometry.k, &v = geometry.v, &y = geometry.y;
    dtype_ = f.inputs[0].dtype;
    element_ = element_size(dtype_);
    scale_ = ir::attention_qk_factor(r.node, s.head_size);
    scale_ *= scale_;
    const int64_t group = s.q_heads / s.kv_heads;
    const int64_t matrix = checked_mul(s.q_seq, s.kv_seq, "attention logits");
    const int64_t heads_total = checked_mul(s.batch, s.q_heads, "attention heads");
    const int64_t logit_count = checked_mul(heads_total, matrix, "attention logits");
    logits_bytes_ = align_up(static_cast<size_t>(checked_mul(logit_count, static_cast<int64_t>(element_), "attention logits")));

    // Calls: one over every head when one stride steps through all of them (4-D without
    // grouping); else the fewer of one call per batch element (over its heads; with grouping,
    // per batch element and key/value head, the group sharing K and V) and one call per query
    // head (over the batch). Logits are [batch, heads, queries, keys] either way.
    int64_t per_call = 0, q_stride = 0, k_stride = 0, v_stride = 0, y_stride = 0, logit_stride = 0;
    const bool one_stride = group == 1 && q.batch == s.q_heads * q.head && k.batch == s.kv_heads * k.head &&
                            v.batch == s.kv_heads * v.head && y.batch == s.q_heads * y.head;
    const int64_t calls_by_batch = group == 1 ? s.batch : s.batch * s.kv_heads;
    if (one_stride || s.batch == 1) {
      per_call = one_stride ? heads_total : s.q_heads;
      q_stride = q.head, k_stride = k.head, v_stride = v.head, y_stride = y.head, logit_stride = matrix;
      if (group == 1) {
        calls_.push_back({q.offset, k.offset, v.offset, y.offset, 0});
      } else {
        per_call = group;
        k_stride = v_stride = 0;
        for (int64_t kh = 0; kh < s.kv_heads; ++kh)
          calls_.push_back({q.offset + kh * group * q.head, k.offset + kh * k.head, v.offset + kh * v.head,
                            y.offset + kh * group * y.head, kh * group * matrix});
      }
    } else if (calls_by_batch <= s.q_heads) {
      per_call = group == 1 ? s.q_heads : group;
      q_stride = q.head, y_stride = y.head, logit_stride = matrix;
      k_stride = group == 1 ? k.head : 0;
      v_stride = group == 1 ? v.head : 0;
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t kh = 0; kh < (group == 1 ? 1 : s.kv_heads); ++kh)
          calls_.push_back({q.at(b, kh * group, 0), k.at(b, kh, 0), v.at(b, kh, 0), y.at(b, kh * group, 0),
                            (b * s.q_heads + kh * group) * matrix});
    } else {
      per_call = s.batch;
      q_stride = q.batch, k_stride = k.batch, v_stride = v.batch, y_stride = y.batch;
      logit_stride = s.q_heads * matrix;
      for (int64_t h = 0; h < s.q_heads; ++h)
        calls_.push_back({q.at(0, h, 0), k.at(0, h / group, 0), v.at(0, h / group, 0), y.at(0, h, 0), h * matrix});
    }
    if (per_call > INT32_MAX) throw r.node.error(ErrorKind::kUnsupported, "more than 2^31 attention heads in one product");
    const int32_t batch = static_cast<int32_t>(per_call);
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    if (dtype_ == DType::kFloat32)
      compute = r.precision == Precision::kFp32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F_FAST_TF32;
    const cudaDataType_t type = cuda_type(dtype_);
    // logits^T [keys, queries] (column-major, ld keys) = K [head_size, keys]^T-op ... as cuBLASLt
    // sees row-major data: A = K (column-major [head, keys], ld k.row, transposed),
    // B = Q (column-major [head, queries], ld q.row).
    scores_ = std::make_unique<BatchedProduct>(compute, type, type, true, s.kv_seq, s.q_seq, s.head_size, k.row,
                                               q.row, s.kv_seq, batch, k_stride, q_stride, logit_stride,
                                               services.cublaslt());
    // Y^T [v_head, queries] (ld y.row) = V^T [v_head, keys] (ld v.row) * P^T [keys, queries] (ld keys).
    values_ = std::make_unique<BatchedProduct>(compute, type, type, false, s.v_head_size, s.q_seq, s.kv_seq, v.row,
                                               s.kv_seq, y.row, batch, v_stride, logit_stride, y_stride,
                                               services.cublaslt());

    args_.rows = heads_total * s.q_seq;
    args_.q_heads = s.q_heads;
    args_.queries = s.q_seq;
    args_.keys = s.kv_seq;
    args_.causal = r.node.attrs.get_int("is_causal", 0) != 0;
    args_.left_window = r.node.attrs.get_int("left_window_size", -1);
    args_.right_window = r.node.attrs.get_int("right_window_size", -1);
    if (r.has_input(3)) {
      const std::vector<int64_t>& ms = r.input_shape(3);
      std::vector<int64_t> full(4 - ms.size(), 1);
      full.insert(full.end(), ms.begin(), ms.end());
      const int64_t want[4] = {s.batch, s.q_heads, s.q_seq, s.kv_seq};
      int64_t stride = 1;
      for (int d = 3; d >= 0; --d) {
        if (d < 3 && full[static_cast<size_t>(d)] != 1 && full[static_cast<size_t>(d)] != want[d])
          throw r.node.error(ErrorKind::kInvalidArgument, "attn_mask of shape " + shape_to_string(ms) +
                                                              " does not broadcast to [batch, heads, q, keys]");
        args_.mask.stride[d] = full[static_cast<size_t>(d)] == 1 && d < 3 ? 0 : stride;
        stride *= full[static_cast<size_t>(d)];
      }
      args_.mask.keys = full[3];
      if (args_.mask.keys > s.kv_seq)
        throw r.node.error(ErrorKind::kInvalidArgument, "attn_mask covers more keys than there are");
      args_.mask.present = true;
      args_.mask.boolean = f.inputs[3].dtype == DType::kBool;
    }
    sdpa_offsets_ = {q.offset, k.offset, v.offset, y.offset, 0};
    output_elements_ = element_count(r.output_shapes.at(0));
    if (f.outputs[0].dtype == DType::kInt8) {
      // kiln::StridedAttention writing int8 (inputs 4 and 5, checked one value each).
      y_int8_ = true;
      y_scale_ = r.constants[4]->data<float>()[0];
      y_zero_point_ = r.constants[5]->data<int8_t>()[0];
      y_scale_on_device_ = static_cast<const float*>(services.upload(&y_scale_, sizeof(float)));
      const int32_t zero = y_zero_point_;
      y_zero_on_device_ = static_cast<const int32_t*>(services.upload(&zero, sizeof(int32_t)));
      float_y_bytes_ = align_up(static_cast<size_t>(checked_mul(output_elements_, static_cast<int64_t>(element_), "attention output")));
    }
    choose_tactic(s, q, k, v, y, services);
  }

  void enqueue(const LayerIO& io, cudaStream_t stream) const override {
    if (flash_chosen_) run_flash(io, stream);
    else run_library(io, io.cudnn, io.cublaslt, io.workspace, stream);
  }

  bool uses_cudnn() const override { return sdpa_ != nullptr; }
  size_t workspace_bytes() const override {
    if (flash_chosen_) return 0;
    return float_y_bytes_ + (sdpa_ ? bias_bytes_ + sdpa_->workspace_bytes() : logits_bytes_ + products_workspace());
  }
  std::string tactic() const override {
    if (flash_chosen_) return "kernel:flash-attention:" + std::to_string(flash_.block_warps) + "-warps";
    if (sdpa_) return "cudnn:fused-attention";
    return "cublasLt+kernel:attention-softmax" + (calls_.size() > 1 ? "x" + std::to_string(calls_.size()) : std::string());
  }

 private:
  // cuDNN's fused attention or the products; an int8 Y is computed in the float type first, at
  // the start of the workspace, and quantized.
  void run_library(const LayerIO& io, cudnnContext* cudnn, cublasLtContext* cublaslt, void* workspace,
                   cudaStream_t stream) const {
    const LayerIO* target = &io;
    LayerIO float_y;
    if (y_int8_) {
      float_y = io;
      float_y.outputs[0] = workspace;
      workspace = static_cast<char*>(workspace) + float_y_bytes_;
      target = &float_y;
    }
    if (sdpa_) {
      KILN_CUDNN_CHECK(cudnnSetStream(cudnn, stream));
      run_sdpa(*target, cudnn, workspace, stream);
    } else {
      run_products(*target, cublaslt, workspace, stream);
    }
    if (!y_int8_) return;
    // QuantizeLinear's kernels (quantize_elements.cuh): eight values a thread where the count
    // and the output's alignment allow (the float Y starts the workspace, 256-byte aligned).
    auto quantize = [&](auto* y) {
      int8_t* q = static_cast<int8_t*>(io.outputs[0]);
      const int64_t n = output_elements_;
      if (n % 8 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0)
        quantize8_kernel<<<grid_for(n / 8), 256, 0, stream>>>(y, q, y_scale_on_device_, y_zero_on_device_, n / 8, -128.f,
                                                              127.f);
      else
        quantize_kernel<<<grid_for(n), 256, 0, stream>>>(y, q, y_scale_on_device_, y_zero_on_device_, n, int64_t{1},
                                                         int64_t{1}, -128.f, 127.f);
    };
    if (dtype_ == DType::kFloat16) quantize(static_cast<const __half*>(float_y.outputs[0]));
    else quantize(static_cast<const float*>(float_y.outputs[0]));
    KILN_CUDA_CHECK_LAUNCH();
  }

  // The products around the softmax kernel.
  void run_products(const LayerIO& io, cublasLtHandle_t handle, void* workspace, cudaStream_t stream) const {
    char* logits = static_cast<char*>(workspace);
    void* product_ws = logits + logits_bytes_;
    const char* q = static_cast<const char*>(io.inputs[0]);
    const char* k = static_cast<const char*>(io.inputs[1]);
    const char* v = static_cast<const char*>(io.inputs[2]);
    char* y = static_cast<char*>(io.outputs[0]);
    const int64_t es = static_cast<int64_t>(element_);
    for (const CallOffsets& c : calls_)
      scores_->run(handle, scale_, k + c.k * es, q + c.q * es, logits + c.logits * es, product_ws, stream);
    const void* mask = args_.mask.present ? io.inputs[3] : nullptr;
    auto softmax = [&](auto* typed_logits) {
      if (args_.mask.boolean) launch_attention_softmax(typed_logits, static_cast<const bool*>(mask), args_, stream);
      else launch_attention_softmax(typed_logits, static_cast<const float*>(mask), args_, stream);
    };
    if (dtype_ == DType::kFloat16) softmax(reinterpret_cast<__half*>(logits));
    else softmax(reinterpret_cast<float*>(logits));
    for (const CallOffsets& c : calls_)
      values_->run(handle, 1.f, v + c.v * es, logits + c.logits * es, y + c.y * es, product_ws, stream);
  }

  // cuDNN's fused attention, after the mask is written as its float16 bias.
  void run_sdpa(const LayerIO& io, cudnnContext* handle, void* workspace, cudaStream_t stream) const {
    __half* bias = static_cast<__half*>(workspace);
    if (args_.mask.present) {
      const int64_t count = bias_elements_;
      if (args_.mask.boolean)
        sdpa_bias_kernel<<<grid_for(count), 256, 0, stream>>>(static_cast<const bool*>(io.inputs[3]), bias, args_.mask,
                                                             bias_dims_.bias_heads, args_.queries, args_.keys, count);
      else
        sdpa_bias_kernel<<<grid_for(count), 256, 0, stream>>>(static_cast<const float*>(io.inputs[3]), bias, args_.mask,
                                                             bias_dims_.bias_heads, args_.queries, args_.keys, count);
      KILN_CUDA_CHECK_LAUNCH();
    }
    const int64_t es = static_cast<int64_t>(element_);
    sdpa_->run(handle, static_cast<const char*>(io.inputs[0]) + sdpa_offsets_.q * es,
               static_cast<const char*>(io.inputs[1]) + sdpa_offsets_.k * es,
               static_cast<const char*>(io.inputs[2]) + sdpa_offsets_.v * es, bias,
               static_cast<char*>(io.outputs[0]) + sdpa_offsets_.y * es, static_cast<char*>(workspace) + bias_bytes_);
  }

  // kiln's kernel on this layer's operands.
  void run_flash(const LayerIO& io, cudaStream_t stream) const {
    FlashAttentionProblem p = flash_;
    const int64_t es = static_cast<int64_t>(element_);
    p.q = static_cast<const char*>(io.inputs[0]) + sdpa_offsets_.q * es;
    p.k = static_cast<const char*>(io.inputs[1]) + sdpa_offsets_.k * es;
    p.v = static_cast<const char*>(io.inputs[2]) + sdpa_offsets_.v * es;
    p.y = static_cast<char*>(io.outputs[0]) + sdpa_offsets_.y * (y_int8_ ? 1 : es);
    p.mask = args_.mask.present ? io.inputs[3] : nullptr;
    KILN_CUDA_CHECK(launch_flash_attention(p, stream));
  }

  // The problem kiln's kernel would run, pointers aside; empty `why` when it takes it.
  FlashAttentionProblem flash_problem(const ir::AttentionShape& s, const SdpaDims& d, std::string& why) const {
    FlashAttentionProblem p;
    p.batch = s.batch, p.q_heads = s.q_heads, p.kv_heads = s.kv_heads, p.queries = s.q_seq, p.keys = s.kv_seq;
    p.head_size = s.head_size;
    for (auto [dst, src] : {std::pair{p.q_strides, d.q_strides}, std::pair{p.k_strides, d.k_strides},
                            std::pair{p.v_strides, d.v_strides}, std::pair{p.y_strides, d.o_strides}})
      std::copy(src, src + 3, dst);
    p.scale = scale_;
    p.causal = args_.causal;
    p.y_int8 = y_int8_;
    p.y_scale = y_scale_;
    p.y_zero_point = y_zero_point_;
    if (args_.mask.present) {
      p.mask_boolean = args_.mask.boolean;
      std::copy(args_.mask.stride, args_.mask.stride + 4, p.mask_strides);
      p.mask_keys = args_.mask.keys;
    }
    if (s.v_head_size != s.head_size) {
      why = "kiln's fused attention takes V's head size equal to Q's";
      return p;
    }
    why = flash_attention_unsupported(p);
    // The engine's buffers are 256-byte aligned; the operands start at these offsets in them.
    // (The launch checks the pointers themselves.)
    if (why.empty() && (sdpa_offsets_.q % 8 || sdpa_offsets_.k % 8 || sdpa_offsets_.v % 8 || sdpa_offsets_.y % 2))
      why = "kiln's fused attention needs Q, K and V 16-byte aligned";
    return p;
  }

  // Whether kiln's kernel gives the products' output on the build's random inputs (the products
  // round the logits to float16: their outputs differ by a few float16 steps; a wrong kernel by
  // far more).
  bool flash_matches_products(BuildServices& services, void* workspace) const {
    const LayerIO& io = services.scratch_io();
    cudaStream_t stream = services.stream();
    if (y_int8_) {
      // Every element written (Y covers its output); one or two int8 steps apart at most where
      // the float16 products round Y before it is quantized.
      const size_t n = static_cast<size_t>(output_elements_);
      std::vector<int8_t> reference(n), fused(n);
      run_library(io, services.cudnn(), services.cublaslt(), workspace, stream);
      KILN_CUDA_CHECK(cudaMemcpyAsync(reference.data(), io.outputs[0], n, cudaMemcpyDeviceToHost, stream));
      KILN_CUDA_CHECK(cudaMemsetAsync(io.outputs[0], 0x55, n, stream));
      run_flash(io, stream);
      KILN_CUDA_CHECK(cudaMemcpyAsync(fused.data(), io.outputs[0], n, cudaMemcpyDeviceToHost, stream));
      KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
      for (size_t i = 0; i < n; ++i)
        if (std::abs(int{reference[i]} - int{fused[i]}) > 2) return false;
      return true;
    }
    // Both write the same elements of Y's buffer; whatever lies between them stays poisoned.
    const size_t y_bytes = static_cast<size_t>(output_elements_) * sizeof(__half);
    std::vector<__half> reference(static_cast<size_t>(output_elements_)), fused(reference.size());
    KILN_CUDA_CHECK(cudaMemsetAsync(io.outputs[0], 0xFF, y_bytes, stream));
    run_products(io, services.cublaslt(), workspace, stream);
    KILN_CUDA_CHECK(cudaMemcpyAsync(reference.data(), io.outputs[0], y_bytes, cudaMemcpyDeviceToHost, stream));
    KILN_CUDA_CHECK(cudaMemsetAsync(io.outputs[0], 0xFF, y_bytes, stream));
    run_flash(io, stream);
    KILN_CUDA_CHECK(cudaMemcpyAsync(fused.data(), io.outputs[0], y_bytes, cudaMemcpyDeviceToHost, stream));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
    float largest = 0.f, worst = 0.f;
    for (size_t i = 0; i < reference.size(); ++i) {
      const float r = __half2float(reference[i]), f = __half2float(fused[i]);
      if (std::isnan(r)) {
        if (!std::isnan(f)) return false;  // written by one and not the other
        continue;
      }
      if (!std::isfinite(f)) return false;
      largest = std::max(largest, std::fabs(r));
      worst = std::max(worst, std::fabs(r - f));
    }
    return worst <= 1.5e-2f * std::max(1.f, largest);
  }

  // Float16 engines: cuDNN's fused attention or kiln's kernel where they take this shape and
  // time faster than the products (the timing cache remembers which).
  void choose_tactic(const ir::AttentionShape& s, const ir::HeadLayout& q, const ir::HeadLayout& k,
                     const ir::HeadLayout& v, const ir::HeadLayout& y, BuildServices& services) {
    if (dtype_ != DType::kFloat16 || args_.left_window >= 0 || args_.right_window >= 0) return;
    // (An int8 Y in a float32 engine: the products and the quantize kernel.)
    SdpaDims d;
    d.batch = s.batch;
    d.q_heads = s.q_heads;
    d.kv_heads = s.kv_heads;
    d.queries = s.q_seq;
    d.keys = s.kv_seq;
    d.head_size = s.head_size;
    d.v_head_size = s.v_head_size;
    for (auto [dst, src] : {std::pair{d.q_strides, q}, std::pair{d.k_strides, k}, std::pair{d.v_strides, v},
                            std::pair{d.o_strides, y}}) {
      dst[0] = src.batch;
      dst[1] = src.head;
      dst[2] = src.row;
      dst[3] = 1;
    }
    d.causal = args_.causal;
    d.scale = scale_;
    if (args_.mask.present) {
      d.bias = true;
      d.bias_batch = args_.mask.stride[0] ? s.batch : 1;
      d.bias_heads = args_.mask.stride[1] ? s.q_heads : 1;
      bias_elements_ = checked_mul(checked_mul(d.bias_batch * d.bias_heads, s.q_seq, "attention bias"), s.kv_seq,
                                   "attention bias");
      bias_bytes_ = align_up(static_cast<size_t>(bias_elements_) * sizeof(__half));
    }
    bias_dims_ = d;
    const std::string key = "attention|b" + std::to_string(s.batch) + "h" + std::to_string(s.q_heads) + "," +
                            std::to_string(s.kv_heads) + "s" + std::to_string(s.q_seq) + "t" + std::to_string(s.kv_seq) +
                            "d" + std::to_string(s.head_size) + "," + std::to_string(s.v_head_size) + "|" +
                            "|layout" + layout_key(q) + layout_key(k) + layout_key(v) + layout_key(y) + "|mask" +
                            std::to_string(int(args_.mask.present)) + "|causal" + std::to_string(int(args_.causal)) +
                            (y_int8_ ? "|int8" : "");
    std::string flash_why;
    flash_ = flash_problem(s, d, flash_why);
    // TacticOptions::attention narrows the choice (for tests and diagnosis).
    const std::string& only = services.tactics().attention;
    if (only == "products") return;
    if (only == "cudnn" && flash_why.empty()) flash_why = "not offered (TacticOptions::attention)";
    const std::optional<std::string> cached = services.cached_tactic(key);
    const bool cached_flash = cached && (*cached == "flash:4" || *cached == "flash:8");
    if (cached_flash && flash_why.empty()) {
      flash_chosen_ = true;
      flash_.block_warps = *cached == "flash:8" ? 8 : 4;
      return;
    }
    if (cached && *cached != "cudnn" && !cached_flash) return;
    std::string why;
    std::unique_ptr<SdpaPlan> plan = only == "kernel" ? nullptr : SdpaPlan::create(d, services.cudnn(), why);
    if (cached && *cached == "cudnn") {
      sdpa_ = std::move(plan);
      if (sdpa_) return;
    }
    if (!plan && !flash_why.empty()) {
      services.record_tactic(key, "cublasLt");
      return;
    }
    const LayerIO& io = services.scratch_io();
    void* ws = services.scratch(float_y_bytes_ + std::max(logits_bytes_ + products_workspace(),
                                                          bias_bytes_ + (plan ? plan->workspace_bytes() : 0)));
    auto timed = [&](const std::function<void(cudaStream_t)>& run) {
      try {
        return services.time_ms(run);
      } catch (const Error&) {
        cudaGetLastError();
        return 1e30f;
      }
    };
    const float products_ms = timed([&](cudaStream_t st) { run_library(io, services.cudnn(), services.cublaslt(), ws, st); });
    float cudnn_ms = 1e30f, flash_ms = 1e30f;
    if (plan) {
      sdpa_ = std::move(plan);
      cudnn_ms = timed([&](cudaStream_t st) { run_library(io, services.cudnn(), services.cublaslt(), ws, st); });
    }
    if (flash_why.empty()) {
      // Blocks of 4 and of 8 warps (64 or 128 queries): the faster, where it gives the products'
      // output.
      int best_warps = 4;
      for (int warps : {4, 8}) {
        flash_.block_warps = warps;
        const float ms = timed([&](cudaStream_t st) { run_flash(io, st); });
        if (ms < flash_ms) flash_ms = ms, best_warps = warps;
      }
      flash_.block_warps = best_warps;
      // The reference: the products (cuDNN set aside for the moment).
      std::unique_ptr<SdpaPlan> set_aside = std::move(sdpa_);
      const bool matches = flash_ms < 1e30f && flash_matches_products(services, ws);
      sdpa_ = std::move(set_aside);
      if (flash_ms < 1e30f && !matches) {
        services.log("  attention " + key + ": kiln's fused attention gave wrong results (rejected)");
        flash_ms = 1e30f;
      }
    }
    // Forced (TacticOptions::attention): the one tactic offered, wherever it ran and matched.
    const bool forced = !only.empty();
    if (flash_ms < 1e30f && (forced || (flash_ms < cudnn_ms && flash_ms < products_ms))) {
      flash_chosen_ = true;
      sdpa_.reset();
    } else if (!(cudnn_ms < products_ms) && !(forced && cudnn_ms < 1e30f)) {
      sdpa_.reset();
    }
    char line[160];
    std::snprintf(line, sizeof line, ": products %.4f ms, cuDNN %.4f ms, kiln %.4f ms (%d warps a block)", products_ms,
                  cudnn_ms < 1e30f ? cudnn_ms : -1.f, flash_ms < 1e30f ? flash_ms : -1.f, flash_.block_warps);
    services.log("  attention " + key + line);
    services.record_tactic(key, flash_chosen_ ? "flash:" + std::to_string(flash_.block_warps) : sdpa_ ? "cudnn" : "cublasLt");
  }

  size_t products_workspace() const { return std::max(scores_->workspace_bytes(), values_->workspace_bytes()); }

  static std::string layout_key(const ir::HeadLayout& l) {
    return "(" + std::to_string(l.batch) + "," + std::to_string(l.head) + "," + std::to_string(l.row) + ")";
  }

  DType dtype_ = DType::kFloat32;
  size_t element_ = 4;
  CallOffsets sdpa_offsets_;  // the first element of Q, K, V and Y
  float scale_ = 1.f;
  size_t logits_bytes_ = 0;
  std::vector<CallOffsets> calls_;
  std::unique_ptr<BatchedProduct> scores_, values_;
  SoftmaxArgs args_;
  std::unique_ptr<SdpaPlan> sdpa_;  // set: cuDNN's fused attention was chosen
  FlashAttentionProblem flash_;     // kiln's kernel's problem, pointers aside
  bool flash_chosen_ = false;
  int64_t output_elements_ = 0;     // Y's buffer
  // An int8 Y (kiln::StridedAttention's inputs 4 and 5): its scale and zero point, and the
  // workspace the library tactics compute Y in first.
  bool y_int8_ = false;
  float y_scale_ = 1.f;
  int y_zero_point_ = 0;
  const float* y_scale_on_device_ = nullptr;
  const int32_t* y_zero_on_device_ = nullptr;
  size_t float_y_bytes_ = 0;
  SdpaDims bias_dims_;
  int64_t bias_elements_ = 0;
  size_t bias_bytes_ = 0;
};

std::string attention_check(const LayerRequest& r) {
  if (r.input_dtypes[0] != DType::kFloat32) return "Q is " + to_string(r.input_dtypes[0]) + " (float32 is supported)";
  if (!r.has_input(0) || !r.has_input(1) || !r.has_input(2)) return "Q, K and V are required";
  if (r.has_input(4) || r.has_input(5)) return "a past key/value cache is not supported on the GPU";
  if (r.has_input(6)) return "nonpad_kv_seqlen is not supported on the GPU";
  for (size_t o = 1; o < r.node.outputs.size(); ++o)
    if (!r.node.outputs[o].empty()) return "only the output Y is supported on the GPU (present_key, present_value and the logits are not)";
  if (r.node.attrs.get_float("softcap", 0.f) != 0.f) return "the soft cap is not supported on the GPU";
  if (r.has_input(3) && r.input_dtypes[3] != DType::kBool && r.input_dtypes[3] != DType::kFloat32)
    return "attn_mask must be bool or float32";
  if (r.has_input(3) && (r.input_shape(3).empty() || r.input_shape(3).size() > 4)) return "attn_mask must have rank 1 to 4";
  std::string why;
  ir::attention_shape(r.node, r.input_shape(0), r.input_shape(1), r.input_shape(2), {}, why);
  return why;
}

std::string strided_attention_check(const LayerRequest& r) {
  if (!r.has_input(0) || !r.has_input(1) || !r.has_input(2)) return "Q, K and V are required";
  if (r.input_dtypes[0] != DType::kFloat32) return "Q is " + to_string(r.input_dtypes[0]) + " (float32 is supported)";
  if (r.node.attrs.get_float("softcap", 0.f) != 0.f) return "the soft cap is not supported on the GPU";
  if (r.has_input(3) && r.input_dtypes[3] != DType::kBool && r.input_dtypes[3] != DType::kFloat32)
    return "attn_mask must be bool or float32";
  if (r.has_input(3) && (r.input_shape(3).empty() || r.input_shape(3).size() > 4)) return "attn_mask must have rank 1 to 4";
  if (r.has_input(4) || r.has_input(5)) {
    if (!r.is_constant(4) || !r.is_constant(5) || r.constants[4]->numel() != 1 || r.constants[5]->numel() != 1 ||
        r.constants[4]->dtype() != DType::kFloat32 || r.constants[5]->dtype() != DType::kInt8)
      return "y_scale and y_zero_point must be constants of one value (float32, int8)";
    const float scale = r.constants[4]->data<float>()[0];
    if (!(scale > 0.f) || !std::isfinite(scale)) return "y_scale must be positive and finite";
  }
  try {
    attention_geometry(r);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

LayerFormats attention_formats(const LayerRequest& r) {
  LayerFormats f;
  f.inputs.resize(r.inputs.size());
  const Format storage{r.float_storage(), Layout::kLinear};
  for (size_t i = 0; i < 3; ++i) f.inputs[i] = storage;
  // The mask stays float32 (fp16 would turn -1e9 and finfo.min into -inf) or bool.
  if (r.has_input(3)) f.inputs[3] = Format{r.input_dtypes[3], Layout::kLinear};
  f.outputs.resize(r.output_dtypes.size());
  // kiln::StridedAttention with y_scale and y_zero_point writes int8 (the constants are read on
  // the host, not uploaded).
  f.outputs[0] = r.output_dtypes[0] == DType::kInt8 ? Format{DType::kInt8, Layout::kLinear} : storage;
  for (size_t o = 1; o < f.outputs.size(); ++o) f.outputs[o] = Format{r.storage_of(r.output_dtypes[o]), Layout::kLinear};
  return f;
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(attention) {
  LayerEntry e;
  e.op = "Attention";
  e.check = attention_check;
  e.formats = attention_formats;
  e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices& s) -> std::unique_ptr<Layer> {
    return std::make_unique<AttentionLayer>(r, f, s);
  };
  e.dtypes = "float32, float16 (cuBLASLt products, float32 softmax; output Y only, no KV cache or soft cap)";
  LayerEntry strided = e;
  strided.op = "StridedAttention";
  strided.domain = "kiln";
  strided.check = strided_attention_check;
  strided.dtypes = "float32, float16 (as Attention; no soft cap); Y int8 with y_scale and y_zero_point";
  registry.add(std::move(e));
  registry.add(std::move(strided));
}

}  // namespace kiln::cuda
