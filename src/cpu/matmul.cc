// CPU kernels of MatMul and kiln::FusedMatMul (float32, numpy semantics):
//   Y = act(A @ B + bias + Z), bias [N] per column, Z a residual of Y's shape (FusedMatMul only).
// When B has no batch of its own, A's batch and rows fold into one tall GEMM; otherwise one
// GEMM per output batch entry, with broadcast batch dims read at stride 0.
//
// A constant 2-D B (a layer's weights) is packed once, when the kernel is created, for kiln's
// sgemm (cpu/sgemm.h). With AVX-512, B goes into 32-column panels and rows_sgemm computes Y
// row-major, A's rows the broadcast side, with the bias, residual and activation in the same
// pass. Otherwise packed_sgemm computes Y^T = B^T A^T: B^T is its packed A, A^T (A's rows
// transposed into a scratch buffer) its B, and Y^T is transposed back into Y with the residual
// and the activation. BLAS would pack the weights again on every call, which at a transformer's
// batch 1 costs about as much as the product (docs/design/cpu-gemm.md). In an engine of bfloat16
// products (KernelInit::bfloat16_products) on a CPU that has them, B is packed in bfloat16
// instead and the product runs on bf16_rows_gemm (cpu/bf16_gemm.h) with the same epilogue.

#include <algorithm>
#include <vector>

#include "cpu/bf16_gemm.h"
#include "cpu/gemm_util.h"
#include "cpu/kernel.h"
#include "cpu/packed_weights.h"
#include "cpu/parallel.h"
#include "cpu/sgemm.h"

namespace kiln::cpu {

namespace {

class MatMulKernel final : public Kernel {
 public:
  MatMulKernel(const KernelInit& init, bool fused)
      : fused_(fused), epilogue_(fused ? ir::Activation::from_node(init.node) : ir::Activation{}) {
    use_single_threaded_blas();
    const Tensor* w = init.constants.size() > 1 ? init.constants[1] : nullptr;
    if (w && w->dtype() == DType::kFloat32 && w->rank() == 2 && w->numel() > 0) {
      const int64_t K = w->dim(0), N = w->dim(1);
      // A loaded engine's panels are taken as they are; otherwise (or packed for another CPU) B's values.
      const ir::PackedConstant* pack = init.packed_input(1);
      if (const Bf16GemmIsa isa = bf16_products_isa(init.bfloat16_products); isa != Bf16GemmIsa::kNone) {
        if (!(pack && adopt_packed(*pack, PackView::kRows, w->shape(), isa, bf16_)))
          bf16_.pack(isa, constant_values(*w, pack).data<float>(), K, N, N);
        return;
      }
      if (sgemm_isa() == SgemmIsa::kAvx512) {
        if (!(pack && adopt_packed(*pack, PackView::kRows, w->shape(), columns_)))
          columns_.pack(constant_values(*w, pack).data<float>(), K, N, N);
        return;
      }
      // B^T [N x K], then its panels.
      std::vector<float> wt(static_cast<size_t>(N * K));
      transpose_floats(constant_values(*w, pack).data<float>(), K, N, wt.data());
      packed_.pack(wt.data(), N, K, K);
    }
  }

  std::string tactic() const override {
    return bf16_tactic(bf16_.isa());
  }

  // Every path of a constant 2-D B runs on its panels. packed_ (CPUs without AVX-512) is not a
  // layout engine files hold: B stays values there.
  std::vector<std::pair<size_t, ir::PackedConstant>> packed_constants() const override {
    if (!bf16_.empty()) return {{1, packed_constant(bf16_, PackView::kRows)}};
    if (!columns_.empty()) return {{1, packed_constant(columns_, PackView::kRows)}};
    return {};
  }

  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    std::vector<int64_t> as = in[0]->shape(), bs = in[1]->shape();
    if (as.size() == 1) as.insert(as.begin(), 1);
    if (bs.size() == 1) bs.push_back(1);
    const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
    const float* a = in[0]->data<float>();
    const float* b = in[1]->data<float>();
    const float* bias = fused_ && in.size() > 2 && in[2] ? in[2]->data<float>() : nullptr;
    const float* residual = fused_ && in.size() > 3 && in[3] ? in[3]->data<float>() : nullptr;
    float* y = out[0].data<float>();
    if (out[0].numel() == 0) return;

    // Batch dims, right-aligned to the output's batch rank.
    const size_t rank = std::max(as.size(), bs.size()) - 2;
    std::vector<int64_t> ab(rank, 1), bb(rank, 1), ob(rank, 1);
    for (size_t i = 0; i < as.size() - 2; ++i) ab[rank - (as.size() - 2) + i] = as[i];
    for (size_t i = 0; i < bs.size() - 2; ++i) bb[rank - (bs.size() - 2) + i] = bs[i];
    int64_t batch = 1, b_batch = 1;
    for (size_t i = 0; i < rank; ++i) {
      ob[i] = std::max(ab[i], bb[i]);
      if (ab[i] == 0 || bb[i] == 0) ob[i] = 0;
      batch *= ob[i];
      b_batch *= bb[i];
    }
    if (b_batch == 1 && !bf16_.empty() && bs.size() == 2) {
      bf16_rows_gemm(bf16_, batch * M, a, K, y, N, bias, residual, N, &epilogue_, thread_count());
      return;
    }
    if (b_batch == 1 && !columns_.empty() && bs.size() == 2) {
      rows_sgemm(columns_, batch * M, a, K, y, N, bias, residual, N, &epilogue_, thread_count());
      return;
    }
    if (b_batch == 1 && !packed_.empty() && bs.size() == 2) {
      run_packed(a, batch * M, K, N, bias, residual, y);
      return;
    }
    if (b_batch == 1) {
      // Every A matrix meets the same B: one (batch * M) x N GEMM. A's batch is the output's.
      parallel_sgemm(false, false, batch * M, N, K, 1.f, a, K, b, N, 0.f, y, N);
      finish(y, batch * M, N, bias, residual);
      return;
    }
    // Element strides of each batch dim in A and B (0 where broadcast).
    std::vector<int64_t> a_stride(rank), b_stride(rank);
    int64_t sa = M * K, sb = K * N;
    for (size_t i = rank; i-- > 0;) {
      a_stride[i] = ab[i] == 1 ? 0 : sa;
      b_stride[i] = bb[i] == 1 ? 0 : sb;
      sa *= ab[i];
      sb *= bb[i];
    }
    auto offsets = [&](int64_t index, int64_t& ao, int64_t& bo) {
      ao = bo = 0;
      for (size_t i = rank; i-- > 0;) {
        int64_t d = index % ob[i];
        index /= ob[i];
        ao += d * a_stride[i];
        bo += d * b_stride[i];
      }
    };
    const int threads = thread_count();
    if (batch >= threads) {
      parallel_for_each(batch, true, [&](int64_t i) {
        int64_t ao, bo;
        offsets(i, ao, bo);
        sgemm(false, false, M, N, K, 1.f, a + ao, K, b + bo, N, 0.f, y + i * M * N, N);
        epilogue_.apply(y + i * M * N, N, M, N, nullptr, bias, residual ? residual + i * M * N : nullptr, N);
      });
      return;
    }
    for (int64_t i = 0; i < batch; ++i) {
      int64_t ao, bo;
      offsets(i, ao, bo);
      parallel_sgemm(false, false, M, N, K, 1.f, a + ao, K, b + bo, N, 0.f, y + i * M * N, N);
      finish(y + i * M * N, M, N, bias, residual ? residual + i * M * N : nullptr);
    }
  }

 private:
  // Y [rows x N] = act(A [rows x K] @ B + bias + residual) with B packed (the class comment).
  void run_packed(const float* a, int64_t rows, int64_t K, int64_t N, const float* bias, const float* residual,
                  float* y) const {
    thread_local AlignedFloats a_t, y_t;  // the calling thread's, kept between runs
    float* at = a_t.reserve(K * rows);
    float* yt = y_t.reserve(N * rows);
    transpose_floats(a, rows, K, at);
    SgemmEpilogue ep;
    ep.row_bias = bias;
    packed_sgemm(packed_, rows, SgemmB{at, rows, nullptr}, yt, rows, ep, thread_count());
    transpose_floats(yt, N, rows, y);
    if (!epilogue_.is_identity() || residual)
      parallel_for_each(rows, rows * N > 65536, [&](int64_t r) {
        epilogue_.apply(y + r * N, N, 1, N, nullptr, nullptr, residual ? residual + r * N : nullptr, N);
      });
  }

  void finish(float* y, int64_t rows, int64_t n, const float* bias, const float* residual) const {
    if (epilogue_.is_identity() && !bias && !residual) return;
    parallel_for_each(rows, rows * n > 65536, [&](int64_t r) {
      epilogue_.apply(y + r * n, n, 1, n, nullptr, bias, residual ? residual + r * n : nullptr, n);
    });
  }

  bool fused_;
  Epilogue epilogue_;
  PackedColumns columns_;  // B in 32-column panels, when B is a constant matrix (AVX-512)
  PackedA packed_;         // B^T for packed_sgemm, when B is a constant matrix (other CPUs)
  Bf16PackedColumns bf16_;  // B in bfloat16 panels, in place of the others (bfloat16 products)
};

}  // namespace

KILN_REGISTER_CPU_KERNELS(matmul) {
  for (const char* op : {"MatMul", "FusedMatMul"}) {
    KernelEntry e;
    e.op = op;
    e.domain = std::string(op) == "FusedMatMul" ? "kiln" : "";
    e.check = [](const KernelInit& init) -> std::string {
      if (init.dtype(0) != DType::kFloat32 || init.dtype(1) != DType::kFloat32)
        return "input types " + to_string(init.dtype(0)) + ", " + to_string(init.dtype(1)) +
               " are not supported (supported: float32)";
      return "";
    };
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) -> std::unique_ptr<Kernel> {
      return std::make_unique<MatMulKernel>(init, init.node.op == "FusedMatMul");
    };
    e.packed_inputs = {1};
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
