// CPU kernels of Gemm and kiln::FusedGemm (float32):
//   Y = act(alpha * op(A) @ op(B) + beta * C + Z), C broadcast to M x N, Z a residual [M, N]
//   (FusedGemm only).
// A layer's product by constant weights (B constant, A not transposed, alpha 1: a classifier's
// last layer) packs op(B) once, when the kernel is created, and runs on rows_sgemm (AVX-512),
// with beta * C as the column bias when C is one value per column, as MatMul's kernel does:
// OpenBLAS packs the weights again on every call (MobileNet-V2's 1280 x 1000 classifier at
// batch 1: docs/design/cpu-gemm.md, "kiln's sgemm").
// In an engine of bfloat16 products (KernelInit::bfloat16_products) on a CPU that has them, that
// op(B) is packed in bfloat16 instead and runs on bf16_rows_gemm (cpu/bf16_gemm.h).
// Otherwise Y is first filled with beta * C, then the GEMM accumulates into it (BLAS beta = 1).

#include <optional>
#include <vector>

#include "cpu/bf16_gemm.h"
#include "cpu/gemm_util.h"
#include "cpu/kernel.h"
#include "cpu/packed_weights.h"
#include "cpu/parallel.h"
#include "cpu/sgemm.h"

namespace kiln::cpu {

namespace {

class GemmKernel final : public Kernel {
 public:
  GemmKernel(const KernelInit& init, bool fused)
      : alpha_(init.node.attrs.get_float("alpha", 1.f)),
        beta_(init.node.attrs.get_float("beta", 1.f)),
        trans_a_(init.node.attrs.get_int("transA", 0) != 0),
        trans_b_(init.node.attrs.get_int("transB", 0) != 0),
        epilogue_(fused ? ir::Activation::from_node(init.node) : ir::Activation{}) {
    use_single_threaded_blas();
    const Tensor* w = init.constants.size() > 1 ? init.constants[1] : nullptr;
    const Bf16GemmIsa bf16_isa = bf16_products_isa(init.bfloat16_products);
    const bool bf16 = bf16_isa != Bf16GemmIsa::kNone;
    if (w && w->dtype() == DType::kFloat32 && w->rank() == 2 && w->numel() > 0 && !trans_a_ && alpha_ == 1.f &&
        (bf16 || sgemm_isa() == SgemmIsa::kAvx512)) {
      const int64_t K = trans_b_ ? w->dim(1) : w->dim(0), N = trans_b_ ? w->dim(0) : w->dim(1);
      view_ = trans_b_ ? PackView::kTransposed : PackView::kRows;
      // A loaded engine's panels are taken as they are; otherwise (or packed for another CPU) B's values.
      const ir::PackedConstant* pack = init.packed_input(1);
      const bool taken = pack && (bf16 ? adopt_packed(*pack, view_, w->shape(), bf16_isa, bf16_)
                                       : adopt_packed(*pack, view_, w->shape(), columns_));
      if (!taken) {
        const std::vector<float> op_b = pack_matrix(view_, constant_values(*w, pack).data<float>(), w->shape());
        if (bf16) bf16_.pack(bf16_isa, op_b.data(), K, N, N);
        else columns_.pack(op_b.data(), K, N, N);
      }
      c_by_column_ = c_is_per_column(init, N);
    }
  }

  std::string tactic() const override {
    return bf16_tactic(bf16_.isa());
  }

  // B is read at run only where C varies along the rows (the general path).
  std::vector<std::pair<size_t, ir::PackedConstant>> packed_constants() const override {
    if (!c_by_column_) return {};
    if (!bf16_.empty()) return {{1, packed_constant(bf16_, view_)}};
    if (!columns_.empty()) return {{1, packed_constant(columns_, view_)}};
    return {};
  }

  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    const Tensor& a = *in[0];
    const Tensor& b = *in[1];
    const Tensor* c = in.size() > 2 ? in[2] : nullptr;
    const float* residual = in.size() > 3 && in[3] ? in[3]->data<float>() : nullptr;
    Tensor& yt = out[0];
    const int64_t M = yt.dim(0), N = yt.dim(1);
    const int64_t K = trans_a_ ? a.dim(0) : a.dim(1);
    float* y = yt.data<float>();
    if (M == 0 || N == 0) return;
    const bool packed_bf16 = !bf16_.empty() && bf16_.cols() == N && bf16_.depth() == K;
    if (packed_bf16 || (!columns_.empty() && columns_.cols() == N && columns_.depth() == K)) {
      if (std::optional<std::vector<float>> bias = column_bias(c, N)) {
        const float* col_bias = bias->empty() ? nullptr : bias->data();
        if (packed_bf16) bf16_rows_gemm(bf16_, M, a.data<float>(), K, y, N, col_bias, residual, N, &epilogue_, thread_count());
        else rows_sgemm(columns_, M, a.data<float>(), K, y, N, col_bias, residual, N, &epilogue_, thread_count());
        return;
      }
    }
    float gemm_beta = 0.f;
    if (c && beta_ != 0.f) {
      // Broadcast strides of C over the M x N output (0 along a dim of size 1 or missing).
      const float* cv = c->data<float>();
      int64_t row_stride = 0, col_stride = 0;
      if (c->rank() >= 1 && c->shape().back() != 1) col_stride = 1;
      if (c->rank() == 2 && c->dim(0) != 1) row_stride = c->dim(1);
      parallel_for_each(M, M * N > 65536, [&](int64_t i) {
        for (int64_t j = 0; j < N; ++j) y[i * N + j] = beta_ * cv[i * row_stride + j * col_stride];
      });
      gemm_beta = 1.f;
    }
    parallel_sgemm(trans_a_, trans_b_, M, N, K, alpha_, a.data<float>(), a.dim(1), b.data<float>(), b.dim(1),
                   gemm_beta, y, N);
    if (!epilogue_.is_identity() || residual) {
      parallel_for_each(M, M * N > 65536, [&](int64_t i) {
        epilogue_.apply(y + i * N, N, 1, N, nullptr, nullptr, residual ? residual + i * N : nullptr, N);
      });
    }
  }

 private:
  // beta * C as one value per column of the M x N output (empty: no C); nullopt when C varies
  // along the rows (it is then added the general way).
  std::optional<std::vector<float>> column_bias(const Tensor* c, int64_t n) const {
    if (!c || beta_ == 0.f) return std::vector<float>();
    if (c->rank() > 2 || (c->rank() == 2 && c->dim(0) != 1)) return std::nullopt;
    const int64_t cols = c->rank() == 0 ? 1 : c->shape().back();
    if (cols != 1 && cols != n) return std::nullopt;
    std::vector<float> bias(static_cast<size_t>(n));
    const float* cv = c->data<float>();
    for (int64_t j = 0; j < n; ++j) bias[static_cast<size_t>(j)] = beta_ * cv[cols == 1 ? 0 : j];
    return bias;
  }

  // Whether C's declared type makes it absent or one value per column (column_bias never nullopt).
  bool c_is_per_column(const KernelInit& init, int64_t n) const {
    if (!init.has_input(2) || beta_ == 0.f) return true;
    const ir::TensorType& c = *init.input_types[2];
    if (!c.shape || c.rank() > 2 || !ir::all_known(*c.shape)) return false;
    const int64_t cols = c.rank() == 0 ? 1 : c.shape->back().value;
    return (cols == 1 || cols == n) && (c.rank() < 2 || (*c.shape)[0].value == 1);
  }

  float alpha_, beta_;
  bool trans_a_, trans_b_;
  PackView view_ = PackView::kRows;  // how op(B) is read from B
  bool c_by_column_ = false;
  Epilogue epilogue_;
  PackedColumns columns_;  // op(B) in 32-column panels, when B is a constant matrix (AVX-512)
  Bf16PackedColumns bf16_;  // op(B) in bfloat16 panels, in place of columns_ (bfloat16 products)
};

}  // namespace

KILN_REGISTER_CPU_KERNELS(gemm) {
  for (const char* op : {"Gemm", "FusedGemm"}) {
    KernelEntry e;
    e.op = op;
    e.domain = std::string(op) == "FusedGemm" ? "kiln" : "";
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) -> std::unique_ptr<Kernel> {
      return std::make_unique<GemmKernel>(init, init.node.op == "FusedGemm");
    };
    e.packed_inputs = {1};
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
