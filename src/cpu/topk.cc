// CPU kernels of TopK (float32/float64/integers; ties keep the lower index first, as ONNX
// asks), Trilu (any dtype), CumSum and CumProd (float32/float64/int32/int64), OneHot and NonZero.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "cpu/data_movement.h"
#include "cpu/kernel.h"
#include "cpu/wrapping.h"
#include "ops/non_zero.h"

namespace kiln::cpu {

namespace {

void outer_inner(const std::vector<int64_t>& s, size_t axis, int64_t& outer, int64_t& inner) {
  outer = inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= s[d];
  for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
}

template <class T>
void topk(const Tensor& x, size_t axis, int64_t k, bool largest, Tensor& values, Tensor& indices) {
  int64_t outer, inner;
  outer_inner(x.shape(), axis, outer, inner);
  int64_t n = x.shape()[axis];
  const T* xv = x.data<T>();
  T* yv = values.data<T>();
  int64_t* yi = indices.data<int64_t>();
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const T* base = xv + o * n * inner + i;
      std::iota(order.begin(), order.end(), 0);
      auto before = [&](int64_t a, int64_t b) {
        T va = base[a * inner], vb = base[b * inner];
        if (va != vb) return largest ? va > vb : va < vb;
        return a < b;
      };
      std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
      for (int64_t j = 0; j < k; ++j) {
        int64_t at = (o * k + j) * inner + i;
        yv[at] = base[order[static_cast<size_t>(j)] * inner];
        yi[at] = order[static_cast<size_t>(j)];
      }
    }
}

// CumSum (kProduct false) and CumProd along `axis`; integers wrap.
template <class T, bool kProduct>
void cumulate(const Tensor& x, size_t axis, bool exclusive, bool reverse, Tensor& y) {
  int64_t outer, inner;
  outer_inner(x.shape(), axis, outer, inner);
  int64_t n = x.shape()[axis];
  const T* xv = x.data<T>();
  T* yv = y.data<T>();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      T acc = kProduct ? T(1) : T(0);
      for (int64_t s = 0; s < n; ++s) {
        int64_t j = reverse ? n - 1 - s : s;
        int64_t at = (o * n + j) * inner + i;
        if (exclusive) {
          yv[at] = acc;
          acc = kProduct ? wrapping_mul(acc, xv[at]) : wrapping_add(acc, xv[at]);
        } else {
          acc = kProduct ? wrapping_mul(acc, xv[at]) : wrapping_add(acc, xv[at]);
          yv[at] = acc;
        }
      }
    }
}

std::function<std::string(const KernelInit&)> numeric4 = accept_dtypes({DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64});

}  // namespace

KILN_REGISTER_CPU_KERNELS(topk) {
  {
    KernelEntry e;
    e.op = "TopK";
    e.check = accept_dtypes({DType::kFloat32, DType::kFloat64, DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64,
                             DType::kUInt8, DType::kUInt16, DType::kUInt32, DType::kUInt64});
    e.dtypes = "float32, float64, integers";
    e.create = [](const KernelInit& init) {
      int64_t axis_attr = init.node.attrs.get_int("axis", -1);
      bool largest = init.node.attrs.get_int("largest", 1) != 0;
      return make_kernel([=](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        size_t axis = static_cast<size_t>(axis_attr < 0 ? axis_attr + in[0]->rank() : axis_attr);
        int64_t k = in[1]->value_as_int(0);
        // An unused output still needs storage here.
        Tensor values = out[0].defined() ? out[0] : Tensor(in[0]->dtype(), out[1].shape());
        Tensor indices = out[1].defined() ? out[1] : Tensor(DType::kInt64, out[0].shape());
        switch (in[0]->dtype()) {
          case DType::kFloat32: topk<float>(*in[0], axis, k, largest, values, indices); break;
          case DType::kFloat64: topk<double>(*in[0], axis, k, largest, values, indices); break;
          case DType::kInt8: topk<int8_t>(*in[0], axis, k, largest, values, indices); break;
          case DType::kInt16: topk<int16_t>(*in[0], axis, k, largest, values, indices); break;
          case DType::kInt32: topk<int32_t>(*in[0], axis, k, largest, values, indices); break;
          case DType::kUInt8: topk<uint8_t>(*in[0], axis, k, largest, values, indices); break;
          case DType::kUInt16: topk<uint16_t>(*in[0], axis, k, largest, values, indices); break;
          case DType::kUInt32: topk<uint32_t>(*in[0], axis, k, largest, values, indices); break;
          case DType::kUInt64: topk<uint64_t>(*in[0], axis, k, largest, values, indices); break;
          default: topk<int64_t>(*in[0], axis, k, largest, values, indices); break;
        }
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "Trilu";
    e.dtypes = "all";
    e.create = [](const KernelInit& init) {
      bool upper = init.node.attrs.get_int("upper", 1) != 0;
      return make_kernel([upper](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        int64_t k = in.size() > 1 && in[1] ? in[1]->value_as_int(0) : 0;
        const auto& s = in[0]->shape();
        int64_t rows = s[s.size() - 2], cols = s.back();
        size_t es = element_size(in[0]->dtype());
        const auto* x = static_cast<const unsigned char*>(in[0]->raw());
        auto* y = static_cast<unsigned char*>(out[0].raw());
        int64_t mats = rows != 0 && cols != 0 ? in[0]->numel() / (rows * cols) : 0;
        for (int64_t m = 0; m < mats; ++m)
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) {
              size_t at = static_cast<size_t>((m * rows + r) * cols + c) * es;
              bool keep = upper ? c - r >= k : c - r <= k;
              if (keep) std::memcpy(y + at, x + at, es);
              else std::memset(y + at, 0, es);
            }
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "CumSum";
    e.check = numeric4;
    e.dtypes = "float32, float64, int32, int64";
    e.create = [](const KernelInit& init) {
      bool exclusive = init.node.attrs.get_int("exclusive", 0) != 0;
      bool reverse = init.node.attrs.get_int("reverse", 0) != 0;
      const bool product = init.node.op == "CumProd";
      return make_kernel([=](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        int64_t rank = in[0]->rank();
        int64_t a = in[1]->value_as_int(0);
        if (a < -rank || a >= rank) throw Error(ErrorKind::kInvalidArgument, "axis " + std::to_string(a) + " is out of range");
        size_t axis = static_cast<size_t>(a < 0 ? a + rank : a);
        auto run = [&](auto tag) {
          using T = decltype(tag);
          if (product) cumulate<T, true>(*in[0], axis, exclusive, reverse, out[0]);
          else cumulate<T, false>(*in[0], axis, exclusive, reverse, out[0]);
        };
        switch (in[0]->dtype()) {
          case DType::kFloat32: run(float{}); break;
          case DType::kFloat64: run(double{}); break;
          case DType::kInt32: run(int32_t{}); break;
          default: run(int64_t{}); break;
        }
      });
    };
    registry.add(e);
    e.op = "CumProd";
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "OneHot";
    e.dtypes = "any indices (numeric); any values";
    e.create = [](const KernelInit& init) {
      int64_t axis_attr = init.node.attrs.get_int("axis", -1);
      return make_kernel([axis_attr](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        const Tensor& idx = *in[0];
        Tensor& y = out[0];
        int64_t rank = y.rank();
        size_t axis = static_cast<size_t>(axis_attr < 0 ? axis_attr + rank : axis_attr);
        int64_t outer, inner;
        outer_inner(y.shape(), axis, outer, inner);
        int64_t depth = y.shape()[axis];
        size_t es = element_size(y.dtype());
        const auto* vals = static_cast<const unsigned char*>(in[2]->raw());
        auto* yp = static_cast<unsigned char*>(y.raw());
        for (int64_t i = 0; i < y.numel(); ++i) std::memcpy(yp + static_cast<size_t>(i) * es, vals, es);
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t i = 0; i < inner; ++i) {
            // Out of range (NaN included): all "off". Checked on the double first, as a NaN or
            // huge float index has no int64 value (fuzz_graph: OneHot of Sqrt(-1.5)).
            const double f = idx.value_as_double(o * inner + i);
            if (!(f > -static_cast<double>(depth) - 1 && f < static_cast<double>(depth))) continue;
            int64_t v = static_cast<int64_t>(f);
            if (v < 0) v += depth;  // negative indices count from the end
            std::memcpy(yp + static_cast<size_t>((o * depth + v) * inner + i) * es, vals + es, es);
          }
      });
    };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "NonZero";
    e.dtypes = "all";
    e.create = [](const KernelInit&) {
      return make_kernel([](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        const Tensor& x = *in[0];
        const int64_t n = out[0].rank() == 2 ? out[0].dim(1) : 0;
        const int64_t rank = x.rank();
        if (rank == 0 || n == 0) return;  // (a scalar's output has no rows)
        // The flat indices into the last row, then each coordinate row from them; the last row's
        // own coordinate (stride 1) last, over the indices in place.
        int64_t* y = out[0].data<int64_t>();
        int64_t* flat = y + (rank - 1) * n;
        const int64_t found = ir::nonzero_flat_indices(x, flat, n);
        const std::vector<int64_t> strides = contiguous_strides(x.shape());
        for (int64_t d = 0; d + 1 < rank; ++d)
          for (int64_t j = 0; j < found; ++j) y[d * n + j] = flat[j] / strides[static_cast<size_t>(d)] % x.dim(d);
        if (rank > 1)
          for (int64_t j = 0; j < found; ++j) flat[j] %= x.dim(rank - 1);
      });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
