// CPU kernels of Expand (a strided copy with stride 0 on broadcast dims) and Tile (each
// output row reads input row (coords mod input dims), then the row itself repeats).
#include <cstring>

#include "cpu/data_movement.h"
#include "cpu/kernel.h"

namespace kiln::cpu {

namespace {

void expand(const Tensor& in, Tensor& out) {
  const auto& os = out.shape();
  size_t rank = os.size(), off = rank - in.shape().size();
  std::vector<int64_t> in_strides = contiguous_strides(in.shape());
  std::vector<int64_t> strides(rank, 0);
  for (size_t i = off; i < rank; ++i)
    strides[i] = in.shape()[i - off] == 1 ? 0 : in_strides[i - off];
  strided_copy(in.raw(), 0, strides, out.raw(), os, element_size(in.dtype()));
}

void tile(const Tensor& in, Tensor& out) {
  const auto& is = in.shape();
  const auto& os = out.shape();
  size_t es = element_size(in.dtype());
  if (out.numel() == 0) return;
  if (is.empty()) {
    std::memcpy(out.raw(), in.raw(), es);
    return;
  }
  int64_t in_row = is.back(), out_row = os.back();
  size_t in_row_bytes = static_cast<size_t>(in_row) * es;
  std::vector<int64_t> in_strides = contiguous_strides(is);
  int64_t rows = out.numel() / out_row;
  const auto* x = static_cast<const unsigned char*>(in.raw());
  auto* y = static_cast<unsigned char*>(out.raw());
  std::vector<int64_t> c(os.size() - 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t src = 0;
    for (size_t d = 0; d < c.size(); ++d) src += (c[d] % is[d]) * in_strides[d];
    unsigned char* dst = y + static_cast<size_t>(r * out_row) * es;
    for (int64_t k = 0; k < out_row / in_row; ++k)
      std::memcpy(dst + static_cast<size_t>(k) * in_row_bytes, x + static_cast<size_t>(src) * es, in_row_bytes);
    for (size_t d = c.size(); d-- > 0;) {
      if (++c[d] < os[d]) break;
      c[d] = 0;
    }
  }
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(expand) {
  for (const char* op : {"Expand", "Tile"}) {
    KernelEntry e;
    e.op = op;
    e.dtypes = "all";
    e.create = [](const KernelInit& init) {
      bool is_tile = init.node.op == "Tile";
      return make_kernel([is_tile](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        if (is_tile) tile(*in[0], out[0]);
        else expand(*in[0], out[0]);
      });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
