// CPU kernels of Gemm and kiln::FusedGemm (float32):
//   Y = act(alpha * op(A) @ op(B) + beta * C + Z), C broadcast to M x N, Z a residual [M, N]
//   (FusedGemm only).
// Y is first filled with beta * C, then the GEMM accumulates into it (BLAS beta = 1).

#include "cpu/gemm_util.h"
#include "cpu/kernel.h"
#include "cpu/parallel.h"

namespace kiln::cpu {

namespace {

class GemmKernel final : public Kernel {
 public:
  GemmKernel(const ir::Node& node, bool fused)
      : alpha_(node.attrs.get_float("alpha", 1.f)),
        beta_(node.attrs.get_float("beta", 1.f)),
        trans_a_(node.attrs.get_int("transA", 0) != 0),
        trans_b_(node.attrs.get_int("transB", 0) != 0),
        epilogue_(fused ? ir::Activation::from_node(node) : ir::Activation{}) {
    use_single_threaded_blas();
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
  float alpha_, beta_;
  bool trans_a_, trans_b_;
  Epilogue epilogue_;
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
      return std::make_unique<GemmKernel>(init.node, init.node.op == "FusedGemm");
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
