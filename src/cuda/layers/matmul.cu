// MatMul, Gemm, kiln::FusedMatMul and kiln::FusedGemm on cuBLASLt.
//
// A fused op's residual Z is cuBLASLt's C (beta 1): D = act(alpha A B + Z + bias) in one pass.
// Row-major Y[M,N] = A[M,K] B[K,N] is computed as the column-major product Y^T = B^T A^T,
// so no operand is ever transposed in memory. Bias and ReLU / GELU run in cuBLASLt's
// epilogue (erf GELU only under 16-bit storage); other activations in one kernel after it (epilogue.h). Batched products use
// cuBLASLt's strided batches; a constant 2-D B (a Linear layer) folds the batch into M.
// The builder times cuBLASLt's heuristic candidates on this GPU and keeps the fastest.
#include <cublasLt.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "cuda/kernels/cublaslt.h"
#include "cuda/kernels/epilogue.h"
#include "cuda/layers/gemm.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/engine.h"
#include "ir/activation.h"

namespace kiln::cuda {

namespace {

// The most workspace a product's algorithm may ask for; a context holds only what the chosen
// algorithms ask for.
constexpr size_t kMatmulWorkspace = size_t{32} << 20;
constexpr int kMaxCandidates = 8;

cudaDataType_t cuda_dtype(DType d) {
  switch (d) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
    default: throw Error(ErrorKind::kUnsupported, "cuBLASLt products take float types, not " + to_string(d));
  }
}

// One product as cuBLASLt sees it (column-major): D[rows=N, cols=M] = opA(Bmat) * opB(Amat).
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;  // of OUR A and B (Gemm's transA/transB)
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch entries
  // Products that strided batches cannot express run as several calls at these offsets.
  std::vector<std::pair<int64_t, int64_t>> call_offsets;  // (A offset, B offset) per call
  int64_t out_call_stride = 0;
};

struct MatmulParams {
  GemmShape shape;
  DType dtype = DType::kFloat32;  // storage of A, B, C, Y
  Precision precision = Precision::kFp32;
  float alpha = 1.f, beta = 0.f;
  bool b_constant = false;
  std::vector<float> bias;        // per column of Y (size N), empty if none
  Tensor c_matrix;                // Gemm's C expanded to [M, N], or undefined
  bool c_runtime = false;         // C is a runtime input, exactly [M, N]
  int c_input = 2;                // which layer input C is
  ir::Activation act;

  std::string key() const {
    std::ostringstream s;
    s << "gemm|m" << shape.m << "n" << shape.n << "k" << shape.k << "|t" << shape.trans_a << shape.trans_b << "|b"
      << shape.batch << "," << shape.stride_a << "," << shape.stride_b << "|" << to_string(dtype) << "|"
      << to_string(precision) << "|bias" << !bias.empty() << "|c" << (c_matrix.defined() || c_runtime) << "|" << act.name();
    if (library_activation() != act.kind) s << "|as-tanh";
    return s.str();
  }
  // The activation cuBLASLt's epilogue is asked for (see the epilogue's choice below).
  ir::ActivationKind library_activation() const {
    return act.kind == ir::ActivationKind::kGelu && element_size(dtype) == 2 ? ir::ActivationKind::kGeluTanh : act.kind;
  }
};

class MatmulLayer final : public Layer {
 public:
  MatmulLayer(MatmulParams p, const Tensor* b_const, BuildServices& services) : p_(std::move(p)) {
    const GemmShape& s = p_.shape;
    const cudaDataType_t dt = cuda_dtype(p_.dtype);
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    if (p_.dtype == DType::kFloat32 && p_.precision != Precision::kFp32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    if (p_.dtype == DType::kFloat32 && p_.precision == Precision::kFp32) compute = CUBLAS_COMPUTE_32F_PEDANTIC;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, compute, CUDA_R_32F));
    // cuBLASLt's A is our B, its B is our A.
    cublasOperation_t op_a = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));

    // Our B, row-major [K,N] (or [N,K] if transB) = column-major [N,K] ld N (or [K,N] ld K).
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_a_, dt, s.trans_b ? s.k : s.n, s.trans_b ? s.n : s.k,
                                                 s.trans_b ? s.k : s.n));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_b_, dt, s.trans_a ? s.m : s.k, s.trans_a ? s.k : s.m,
                                                 s.trans_a ? s.m : s.k));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_d_, dt, s.n, s.m, s.n));
    if (s.batch > 1) {
      int32_t batch = static_cast<int32_t>(s.batch);
      for (auto [layout, stride] : {std::pair{layout_a_, s.stride_b}, std::pair{layout_b_, s.stride_a},
                                    std::pair{layout_d_, s.stride_c}}) {
        KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
        KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                           sizeof(stride)));
      }
    }

    if (b_const) {
      Tensor b = convert_constant(*b_const, Format{p_.dtype, Layout::kLinear});
      b_weights_ = services.upload(b.raw(), b.nbytes());
    }
    if (p_.c_matrix.defined()) {
      Tensor c = convert_constant(p_.c_matrix, Format{p_.dtype, Layout::kLinear});
      c_weights_ = services.upload(c.raw(), c.nbytes());
    }

    // Epilogue: bias and ReLU / GELU in cuBLASLt; anything else after it. cuBLASLt's GELU is the
    // tanh form. Under 16-bit storage it also runs erf GELU: the two differ by at most 4.7e-4
    // (relative L2 1.8e-4 over N(0, 1.5) inputs), less than rounding the output to float16 does
    // (2.1e-4), and a pass after the product would cost as much as the product itself (BERT's and
    // ViT's first feed-forward products, docs/design/attention.md). float32 keeps erf, exactly.
    const ir::ActivationKind library_kind = p_.library_activation();
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const bool has_bias = !p_.bias.empty();
    if (library_kind == ir::ActivationKind::kRelu) epilogue = has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    else if (library_kind == ir::ActivationKind::kGeluTanh) epilogue = has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    else if (has_bias) epilogue = CUBLASLT_EPILOGUE_BIAS;
    const bool library_act = p_.act.none() || library_kind == ir::ActivationKind::kRelu || library_kind == ir::ActivationKind::kGeluTanh;
    if (!library_act) after_ = p_.act;
    if (has_bias) {
      Tensor bias = convert_constant(Tensor::from_vector<float>({s.n}, p_.bias), Format{p_.dtype, Layout::kLinear});
      bias_ = services.upload(bias.raw(), bias.nbytes());
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_, sizeof(bias_)));
      if (s.batch > 1) {
        int64_t zero = 0;
        KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &zero, sizeof(zero)));
      }
    }
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    choose_algo(services);
  }

  ~MatmulLayer() override {
    if (desc_) cublasLtMatmulDescDestroy(desc_);
    for (auto l : {layout_a_, layout_b_, layout_d_})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }

  void enqueue(const LayerIO& io, cudaStream_t stream) const override {
    run(io.cublaslt, io, io.workspace, algo_workspace_, algo_, stream);
  }
  size_t workspace_bytes() const override { return algo_workspace_; }
  std::string tactic() const override {
    return "cublasLt:algo#" + std::to_string(algo_index_) + (after_.none() ? "" : "+epilogue");
  }

 private:
  // `ws` holds `ws_bytes`: at least what `algo` asks for (cuBLASLt's heuristic says).
  void run(cublasLtHandle_t handle, const LayerIO& io, void* ws, size_t ws_bytes, const cublasLtMatmulAlgo_t& algo,
           cudaStream_t stream) const {
    const GemmShape& s = p_.shape;
    const size_t es = element_size(p_.dtype);
    const char* a = static_cast<const char*>(io.inputs[0]);
    const char* b = static_cast<const char*>(b_weights_ ? b_weights_ : io.inputs[1]);
    const void* c = c_weights_ ? c_weights_ : (p_.c_runtime ? io.inputs[p_.c_input] : nullptr);
    char* y = static_cast<char*>(io.outputs[0]);
    const float alpha = p_.alpha;
    const float beta = c ? p_.beta : 0.f;
    const int64_t out_elems = s.m * s.n * s.batch;
    if (s.call_offsets.empty()) {
      // C (a [M, N] addend, or nothing) is read where it is: D = act(alpha A B + beta C + bias).
      KILN_CUBLAS_CHECK(cublasLtMatmul(handle, desc_, &alpha, b, layout_a_, a, layout_b_, &beta, c ? c : y, layout_d_, y,
                                       layout_d_, &algo, ws, ws_bytes, stream));
    } else {
      if (c) throw Error(ErrorKind::kInternal, "a broadcast batched product with an addend");
      for (size_t i = 0; i < s.call_offsets.size(); ++i) {
        const auto [ao, bo] = s.call_offsets[i];
        char* yi = y + static_cast<int64_t>(i) * s.out_call_stride * static_cast<int64_t>(es);
        KILN_CUBLAS_CHECK(cublasLtMatmul(handle, desc_, &alpha, b + bo * static_cast<int64_t>(es), layout_a_,
                                         a + ao * static_cast<int64_t>(es), layout_b_, &beta, yi, layout_d_, yi,
                                         layout_d_, &algo, ws, ws_bytes, stream));
      }
    }
    if (!after_.none()) {
      const int64_t total = s.call_offsets.empty() ? out_elems : s.m * s.n * static_cast<int64_t>(s.call_offsets.size());
      launch_epilogue(y, nullptr, nullptr, total, s.n, 1, p_.dtype, after_, stream);
    }
  }

  void choose_algo(BuildServices& services) {
    cublasLtMatmulHeuristicResult_t results[kMaxCandidates];
    const int count = cublaslt_candidates(services.cublaslt(), desc_, layout_a_, layout_b_, layout_d_, kMatmulWorkspace,
                                          kMaxCandidates, results);
    if (count == 0) throw Error(ErrorKind::kUnsupported, "cuBLASLt has no algorithm for this product (" + p_.key() + ")");
    const std::string key = p_.key();
    if (auto cached = services.cached_tactic(key)) {
      int index = std::atoi(cached->c_str());
      if (index >= 0 && index < count) {
        algo_ = results[index].algo;
        algo_workspace_ = results[index].workspaceSize;
        algo_index_ = index;
        return;
      }
    }
    algo_index_ = 0;
    algo_ = results[0].algo;
    algo_workspace_ = results[0].workspaceSize;
    if (count > 1) {
      const LayerIO& io = services.scratch_io();
      void* scratch_ws = services.scratch(kMatmulWorkspace);
      float best = 1e30f;
      for (int i = 0; i < count; ++i) {
        try {
          float ms = services.time_ms(
              [&](cudaStream_t s) { run(services.cublaslt(), io, scratch_ws, results[i].workspaceSize, results[i].algo, s); });
          if (ms < best) {
            best = ms;
            algo_ = results[i].algo;
            algo_workspace_ = results[i].workspaceSize;
            algo_index_ = i;
          }
        } catch (const Error&) {
          cudaGetLastError();
        }
      }
    }
    services.record_tactic(key, std::to_string(algo_index_));
  }

  MatmulParams p_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t layout_a_ = nullptr, layout_b_ = nullptr, layout_d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  int algo_index_ = 0;
  size_t algo_workspace_ = 0;  // what the chosen algorithm needs: a context's workspace is sized by it
  const void* b_weights_ = nullptr;
  const void* c_weights_ = nullptr;
  const void* bias_ = nullptr;
  ir::Activation after_{};
};

// --- lowering ----------------------------------------------------------------------------------

struct Plan {
  MatmulParams params;
  std::string why;
};

// Row-major strides of the batch dims of `shape` (rank >= 2) broadcast to `out_batch`
// (0 where broadcast).
std::vector<int64_t> batch_strides(const std::vector<int64_t>& shape, const std::vector<int64_t>& out_batch) {
  const int64_t matrix = shape[shape.size() - 1] * shape[shape.size() - 2];
  const size_t nb = shape.size() - 2;
  std::vector<int64_t> strides(out_batch.size(), 0);
  int64_t stride = matrix;
  for (size_t i = 0; i < nb; ++i) {
    size_t d = nb - 1 - i;               // dim of shape
    size_t o = out_batch.size() - 1 - i; // dim of out_batch
    strides[o] = shape[d] == 1 ? 0 : stride;
    stride *= shape[d];
  }
  return strides;
}

Plan plan_matmul(const LayerRequest& r) {
  Plan plan;
  MatmulParams& p = plan.params;
  const ir::Node& n = r.node;
  const bool gemm = n.op == "Gemm" || n.op == "FusedGemm";
  if (!r.has_input(0) || !r.has_input(1)) { plan.why = "A and B are required"; return plan; }
  if (r.input_dtypes[0] != DType::kFloat32 || r.input_dtypes[1] != DType::kFloat32) {
    plan.why = "only float32 products are supported";
    return plan;
  }
  if (n.op == "FusedGemm" || n.op == "FusedMatMul") p.act = ir::Activation::from_node(n);
  p.precision = r.precision;
  p.dtype = r.float_storage();
  p.b_constant = r.is_constant(1);
  std::vector<int64_t> a = r.input_shape(0), b = r.input_shape(1);
  const std::vector<int64_t>& y = r.output_shapes[0];
  GemmShape& s = p.shape;
  if (gemm) {
    s.trans_a = n.attrs.get_int("transA", 0) != 0;
    s.trans_b = n.attrs.get_int("transB", 0) != 0;
    p.alpha = n.attrs.get_float("alpha", 1.f);
    p.beta = n.attrs.get_float("beta", 1.f);
    s.m = s.trans_a ? a[1] : a[0];
    s.k = s.trans_a ? a[0] : a[1];
    s.n = s.trans_b ? b[0] : b[1];
    if (r.has_input(2)) {
      const std::vector<int64_t>& c = r.input_shape(2);
      if (r.is_constant(2)) {
        const Tensor& ct = *r.constants[2];
        const float* cv = ct.data<float>();
        const bool per_column = ct.numel() == s.n && (c.size() == 1 || (c.size() == 2 && c[0] == 1));
        if (per_column && p.beta != 0.f) {
          for (int64_t j = 0; j < s.n; ++j) p.bias.push_back(p.beta * cv[j]);
        } else if (p.beta != 0.f) {
          // Expand C to [M, N] on the host (unidirectional broadcast).
          Tensor full(DType::kFloat32, {s.m, s.n});
          float* f = full.data<float>();
          const int64_t c0 = c.size() == 2 ? c[0] : 1, c1 = c.empty() ? 1 : c.back();
          for (int64_t i = 0; i < s.m; ++i)
            for (int64_t j = 0; j < s.n; ++j)
              f[i * s.n + j] = cv[(c0 == 1 ? 0 : i) * c1 + (c1 == 1 ? 0 : j)];
          p.c_matrix = full;
        }
      } else if (c.size() == 2 && c[0] == s.m && c[1] == s.n) {
        p.c_runtime = true;
      } else {
        plan.why = "a runtime C must have shape MxN (" + shape_to_string(c) + " given)";
        return plan;
      }
    }
    if (n.op == "FusedGemm" && r.has_input(3)) {
      if (p.c_runtime || p.c_matrix.defined()) {
        plan.why = "a residual beside a C that is not one row of biases";
        return plan;
      }
      p.c_runtime = true;
      p.c_input = 3;
      p.beta = 1.f;
    }
    return plan;
  }
  // MatMul / FusedMatMul: numpy semantics.
  if (n.op == "FusedMatMul" && r.has_input(2)) {
    if (!r.is_constant(2)) { plan.why = "the bias must be a constant"; return plan; }
    const float* bv = r.constants[2]->data<float>();
    p.bias.assign(bv, bv + r.constants[2]->numel());
  }
  if (n.op == "FusedMatMul" && r.has_input(3)) {
    p.c_runtime = true;  // the residual, laid out as Y
    p.c_input = 3;
    p.beta = 1.f;
  }
  const bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), 1);
  if (b_vec) b.push_back(1);
  s.m = a[a.size() - 2];
  s.k = a[a.size() - 1];
  s.n = b[b.size() - 1];
  std::vector<int64_t> out_batch(y.begin(), y.end() - (a_vec ? 0 : 1) - (b_vec ? 0 : 1));
  // Batch dims of the output, broadcast from A's and B's.
  size_t nb = std::max(a.size(), b.size()) - 2;
  out_batch.assign(nb, 1);
  for (size_t i = 0; i < nb; ++i) {
    int64_t da = i + a.size() >= nb + 2 ? a[i + a.size() - nb - 2] : 1;
    int64_t db = i + b.size() >= nb + 2 ? b[i + b.size() - nb - 2] : 1;
    out_batch[i] = std::max(da, db);
  }
  int64_t batch = 1;
  for (int64_t d : out_batch) batch *= d;
  std::vector<int64_t> sa = batch_strides(a, out_batch), sb = batch_strides(b, out_batch);
  const bool b_broadcast = std::all_of(sb.begin(), sb.end(), [](int64_t v) { return v == 0; });
  const bool a_full = [&] {
    int64_t expect = s.m * s.k;
    for (int i = static_cast<int>(sa.size()) - 1; i >= 0; --i) {
      if (out_batch[i] != 1 && sa[i] != expect) return false;
      expect *= out_batch[i];
    }
    return true;
  }();
  if (b_broadcast && a_full) {
    s.m *= batch;  // one 2-D product: the batch folds into M
    return plan;
  }
  // Single strides per operand: a strided batch.
  auto single_stride = [&](const std::vector<int64_t>& st, int64_t matrix, int64_t& out) {
    if (std::all_of(st.begin(), st.end(), [](int64_t v) { return v == 0; })) { out = 0; return true; }
    int64_t expect = matrix;
    for (int i = static_cast<int>(st.size()) - 1; i >= 0; --i) {
      if (out_batch[i] != 1 && st[i] != expect) return false;
      expect *= out_batch[i];
    }
    out = matrix;
    return true;
  };
  if (single_stride(sa, s.m * s.k, s.stride_a) && single_stride(sb, s.k * s.n, s.stride_b)) {
    s.batch = batch;
    s.stride_c = s.m * s.n;
    return plan;
  }
  // General broadcasting: one call per output matrix.
  if (p.c_runtime) {
    plan.why = "a residual on a product whose batch broadcasts";
    return plan;
  }
  for (int64_t i = 0; i < batch; ++i) {
    int64_t rem = i, ao = 0, bo = 0;
    for (int d = static_cast<int>(out_batch.size()) - 1; d >= 0; --d) {
      int64_t idx = rem % out_batch[d];
      rem /= out_batch[d];
      ao += idx * sa[d];
      bo += idx * sb[d];
    }
    s.call_offsets.push_back({ao, bo});
  }
  s.out_call_stride = s.m * s.n;
  return plan;
}

LayerFormats matmul_formats(const LayerRequest& r) {
  Plan plan = plan_matmul(r);
  LayerFormats f;
  f.inputs.resize(r.inputs.size());
  const Format storage{plan.params.dtype, Layout::kLinear};
  f.inputs[0] = storage;
  if (!r.is_constant(1)) f.inputs[1] = storage;
  if (plan.params.c_runtime) f.inputs[static_cast<size_t>(plan.params.c_input)] = storage;
  f.outputs = {storage};
  return f;
}

}  // namespace

std::unique_ptr<Layer> make_gemm_layer(const GemmSpec& spec, const Tensor& b, BuildServices& services) {
  MatmulParams p;
  p.shape.m = spec.m;
  p.shape.n = spec.n;
  p.shape.k = spec.k;
  p.shape.trans_b = spec.trans_b;
  p.dtype = spec.dtype;
  p.precision = spec.precision;
  p.b_constant = true;
  p.bias = spec.bias;
  p.c_runtime = spec.addend_input >= 0;
  p.beta = p.c_runtime ? 1.f : 0.f;
  p.c_input = spec.addend_input;
  p.act = spec.act;
  return std::make_unique<MatmulLayer>(std::move(p), &b, services);
}

KILN_REGISTER_CUDA_LAYERS(matmul) {
  for (const char* op : {"MatMul", "FusedMatMul", "Gemm", "FusedGemm"}) {
    LayerEntry e;
    e.op = op;
    e.domain = std::string(op).rfind("Fused", 0) == 0 ? "kiln" : "";
    e.check = [](const LayerRequest& r) { return plan_matmul(r).why; };
    e.formats = matmul_formats;
    e.create = [](const LayerRequest& r, const LayerFormats&, BuildServices& s) -> std::unique_ptr<Layer> {
      Plan plan = plan_matmul(r);
      if (!plan.why.empty()) throw r.node.error(ErrorKind::kUnsupported, plan.why);
      return std::make_unique<MatmulLayer>(plan.params, r.is_constant(1) ? r.constants[1] : nullptr, s);
    };
    e.dtypes = "float32, float16 (cuBLASLt)";
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cuda
