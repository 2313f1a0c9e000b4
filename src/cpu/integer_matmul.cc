// CPU kernels of MatMulInteger and QLinearMatMul as ONNX's reference computes them: int32 sums of
// (a - a_zero) * (b - b_zero); QLinearMatMul then scales by a_scale * b_scale / y_scale (in the
// scales' type), adds y_zero, rounds half to even and saturates. Batch dims broadcast.
#include <cmath>
#include <vector>

#include "cpu/kernel.h"

namespace kiln::cpu {

namespace {

int64_t element_int(const Tensor& t, int64_t i) { return t.value_as_int(i); }

// The int32 products of A [..., M, K] and B [..., K, N] with batch broadcasting (1-D operands
// as MatMul takes them), each zero point per tensor or, for 2-D operands, per row of A / per
// column of B. `emit(out_index, sum)` receives every output element.
template <class Emit>
void integer_products(const ir::Node& node, const Tensor& a, const Tensor& b, const Tensor* a_zero, const Tensor* b_zero,
                      int64_t out_numel, Emit emit) {
  std::vector<int64_t> as = a.shape(), bs = b.shape();
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  if (bs[bs.size() - 2] != k) throw node.error(ErrorKind::kInvalidArgument, "inner dims differ");
  const size_t rank = std::max(as.size(), bs.size()) - 2;
  std::vector<int64_t> batch(rank, 1), a_stride(rank, 0), b_stride(rank, 0);
  int64_t sa = m * k, sb = k * n;
  for (size_t d = 0; d < rank; ++d) {
    const size_t r = rank - 1 - d;
    const int64_t da = d < as.size() - 2 ? as[as.size() - 3 - d] : 1;
    const int64_t db = d < bs.size() - 2 ? bs[bs.size() - 3 - d] : 1;
    if (da != db && da != 1 && db != 1) throw node.error(ErrorKind::kInvalidArgument, "batch dims do not broadcast");
    batch[r] = std::max(da, db);
    a_stride[r] = da == 1 ? 0 : sa;
    b_stride[r] = db == 1 ? 0 : sb;
    sa *= da;
    sb *= db;
  }
  auto zero_of = [&](const Tensor* z, int64_t per, int64_t i, const char* what) -> int64_t {
    if (!z || z->numel() == 0) return 0;
    if (z->numel() == 1) return element_int(*z, 0);
    if (z->numel() == per) return element_int(*z, i);
    throw node.error(ErrorKind::kUnsupported, std::string(what) + " must have one element or one per " +
                                                  (per == m ? "row of A" : "column of B"));
  };
  int64_t batches = 1;
  for (int64_t v : batch) batches *= v;
  if (batches * m * n != out_numel) throw node.error(ErrorKind::kInternal, "the output has the wrong size");
  std::vector<int64_t> index(rank, 0);
  for (int64_t bi = 0; bi < batches; ++bi) {
    int64_t ao = 0, bo = 0;
    for (size_t d = 0; d < rank; ++d) ao += index[d] * a_stride[d], bo += index[d] * b_stride[d];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t za = zero_of(a_zero, m, i, "a_zero_point"), zb = zero_of(b_zero, n, j, "b_zero_point");
        int64_t sum = 0;
        for (int64_t p = 0; p < k; ++p)
          sum += (element_int(a, ao + i * k + p) - za) * (element_int(b, bo + p * n + j) - zb);
        emit((bi * m + i) * n + j, static_cast<int32_t>(sum));
      }
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < batch[d]) break;
      index[d] = 0;
    }
  }
}

float as_half(float v) { return half_to_float(float_to_half(v)); }

}  // namespace

KILN_REGISTER_CPU_KERNELS(integer_matmul) {
  {
    KernelEntry e;
    e.op = "MatMulInteger";
    e.dtypes = "int8, uint8 (int32 output)";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        int32_t* y = out[0].data<int32_t>();
        integer_products(*node, *in[0], *in[1], in.size() > 2 ? in[2] : nullptr, in.size() > 3 ? in[3] : nullptr,
                         out[0].numel(), [&](int64_t o, int32_t v) { y[o] = v; });
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "QLinearMatMul";
    e.dtypes = "int8, uint8; scales float32, float16";
    e.create = [](const KernelInit& init) {
      const ir::Node* node = &init.node;
      return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        for (size_t i : {1, 2, 4, 5, 6, 7})
          if (in[i]->numel() != 1) throw node->error(ErrorKind::kUnsupported, "scales and zero points must be per tensor");
        // The factor in the scales' own type, as the reference computes it.
        double factor;
        if (in[1]->dtype() == DType::kFloat16)
          factor = as_half(as_half(static_cast<float>(in[1]->value_as_double(0)) * static_cast<float>(in[4]->value_as_double(0))) /
                           static_cast<float>(in[6]->value_as_double(0)));
        else
          factor = static_cast<float>(static_cast<float>(in[1]->value_as_double(0)) * static_cast<float>(in[4]->value_as_double(0))) /
                   static_cast<float>(in[6]->value_as_double(0));
        const double y_zero = static_cast<double>(in[7]->value_as_int(0));
        const bool is_signed = out[0].dtype() == DType::kInt8;
        const double lo = is_signed ? -128 : 0, hi = is_signed ? 127 : 255;
        void* y = out[0].raw();
        integer_products(*node, *in[0], *in[3], in[2], in[5], out[0].numel(), [&](int64_t o, int32_t v) {
          const double q = std::min(hi, std::max(lo, std::nearbyint(static_cast<double>(v) * factor + y_zero)));
          if (is_signed) static_cast<int8_t*>(y)[o] = static_cast<int8_t>(q);
          else static_cast<uint8_t*>(y)[o] = static_cast<uint8_t>(q);
        });
      });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
