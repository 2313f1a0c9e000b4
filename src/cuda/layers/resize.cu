// CUDA layer of Resize: nearest (any dtype, moved by element size), linear and cubic (float32,
// stored as float32 or float16, computed in float32), any rank, with every
// coordinate_transformation_mode, nearest_mode, exclude_outside, extrapolation_value and
// cubic_coeff_a the CPU kernel handles; antialias is refused (the CPU kernel has it: its filters
// take any number of taps, where this layer's table holds four).
//
// roi, scales and sizes must be constants: the host computes, per resized axis and output
// index, the source taps (up to 4 indices and weights, or "outside" for tf_crop_and_resize)
// with the CPU kernel's code (ops/resize_taps.h), and uploads them. The kernel reads, per output element,
// the taps of each resized axis and sums their product (the CPU runs one separable pass per
// axis instead; the results agree to float32 rounding). Axes whose taps are the identity are
// read directly. A rank-4 input stored kNHWC is read through its logical strides and the
// output is written kNHWC too.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "cuda/runtime/engine.h"
#include "ops/resize_params.h"
#include "ops/resize_taps.h"

namespace kiln::cuda {

namespace {

constexpr int kBlock = 256;

using Options = ir::ResizeOptions;
using Taps = ir::ResizeTaps;  // the device table's entries

// --- device ----------------------------------------------------------------------------------

struct ResizeParams {
  int rank = 0;
  int64_t n = 0;
  int64_t out_dims[kMaxKernelRank] = {};    // output, memory order
  int64_t in_strides[kMaxKernelRank] = {};  // input element stride of each output dim's axis
  int64_t table[kMaxKernelRank] = {};       // first Taps entry of the dim's table; -1: identity
};

// Nearest: one source element per output element (or the fill value).
template <class U>
__global__ void resize_nearest_kernel(const U* __restrict__ src, const Taps* __restrict__ taps, U* __restrict__ dst,
                                      U fill, ResizeParams p) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += step) {
    int64_t rem = i, off = 0;
    bool outside = false;
#pragma unroll
    for (int d = kMaxKernelRank - 1; d >= 0; --d) {
      if (d >= p.rank) continue;
      const int64_t c = rem % p.out_dims[d];
      rem /= p.out_dims[d];
      if (p.table[d] < 0) {
        off += c * p.in_strides[d];
      } else {
        const Taps& t = taps[p.table[d] + c];
        outside = outside || t.outside;
        off += t.idx[0] * p.in_strides[d];
      }
    }
    dst[i] = outside ? fill : src[off];
  }
}

// Linear / cubic: the sum over the product of the resized axes' taps.
template <class T>
__global__ void resize_interp_kernel(const T* __restrict__ src, const Taps* __restrict__ taps, T* __restrict__ dst,
                                     float extrapolation, ResizeParams p) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += step) {
    int64_t rem = i, base = 0;
    const Taps* active[kMaxKernelRank];
    int64_t active_stride[kMaxKernelRank];
    int n_active = 0;
    bool outside = false;
#pragma unroll
    for (int d = kMaxKernelRank - 1; d >= 0; --d) {
      if (d >= p.rank) continue;
      const int64_t c = rem % p.out_dims[d];
      rem /= p.out_dims[d];
      if (p.table[d] < 0) {
        base += c * p.in_strides[d];
      } else {
        const Taps* t = taps + p.table[d] + c;
        outside = outside || t->outside;
        active[n_active] = t;
        active_stride[n_active] = p.in_strides[d];
        ++n_active;
      }
    }
    if (outside) {
      store_float(dst, i, extrapolation);
      continue;
    }
    int combos = 1;
    for (int a = 0; a < n_active; ++a) combos *= active[a]->n;
    float acc = 0.f;
    for (int c = 0; c < combos; ++c) {
      int rest = c;
      float w = 1.f;
      int64_t off = base;
      for (int a = 0; a < n_active; ++a) {
        const int k = rest % active[a]->n;
        rest /= active[a]->n;
        w *= active[a]->w[k];
        off += active[a]->idx[k] * active_stride[a];
      }
      acc += w * load_float(src, off);
    }
    store_float(dst, i, acc);
  }
}

template <class F> void with_element(size_t es, F&& f) {
  switch (es) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
  }
  throw Error(ErrorKind::kUnsupported, "no CUDA kernel for elements of " + std::to_string(es) + " bytes");
}

// roi, scales, sizes: present when given with elements (an empty tensor counts as absent).
bool present(const LayerRequest& r, size_t i) { return r.has_input(i) && shape_numel(r.inputs[i]->shape) > 0; }

bool nhwc_input(const LayerRequest& r) {
  return r.has_input(0) && !r.is_constant(0) && r.inputs[0]->rank() == 4 && r.inputs[0]->format.layout == Layout::kNHWC;
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(resize) {
  LayerEntry e;
  e.op = "Resize";
  e.dtypes = "all (nearest); float32 (linear, cubic); float32 stored as float16 under fp16";
  e.check = [](const LayerRequest& r) -> std::string {
    const ir::Attributes& a = r.node.attrs;
    if (a.get_int("antialias", 0) != 0) return "antialias is not supported";
    const std::string mode = a.get_string("mode", "nearest");
    if (mode != "nearest" && r.input_dtypes[0] != DType::kFloat32)
      return mode + " mode on " + to_string(r.input_dtypes[0]) + " is not supported (float32 only)";
    if (element_size(r.input_dtypes[0]) == 0) return to_string(r.input_dtypes[0]) + " tensors are not supported";
    if (r.inputs[0]->rank() > kMaxKernelRank)
      return "rank " + std::to_string(r.inputs[0]->rank()) + " is above the CUDA kernel's " + std::to_string(kMaxKernelRank);
    static const char* names[] = {"", "roi", "scales", "sizes"};
    for (size_t i = 1; i < 4; ++i)
      if (present(r, i) && !r.is_constant(i)) return std::string(names[i]) + " must be a constant";
    return "";
  };
  e.formats = [](const LayerRequest& r) {
    const Layout layout = nhwc_input(r) ? Layout::kNHWC : Layout::kLinear;
    LayerFormats f;
    f.inputs.assign(r.inputs.size(), Format{});
    f.inputs[0] = Format{r.storage_of(r.input_dtypes[0]), layout};
    // An empty runtime roi/scales/sizes is taken as it is stored and not read.
    for (size_t i = 1; i < r.inputs.size(); ++i)
      if (r.has_input(i) && !r.is_constant(i)) f.inputs[i] = r.inputs[i]->format;
    f.outputs = {Format{r.storage_of(r.output_dtypes[0]), layout}};
    return f;
  };
  e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices& services) {
    const Options o = ir::resize_options(r.node);
    const TensorSpec& in = *r.inputs[0];
    const std::vector<int64_t>& os = r.output_shapes[0];
    const size_t rank = in.shape.size();
    std::optional<ir::Dims> sizes;
    if (present(r, 3)) sizes = ir::dims_of(r.constants[3]->to_int_vector());
    const ir::ResizePlan plan = ir::resize_plan(r.node, ir::dims_of(in.shape), present(r, 1) ? r.constants[1] : nullptr,
                                                present(r, 2) ? r.constants[2] : nullptr, sizes);
    // Per logical axis: its taps, or none (identity).
    std::vector<Taps> table;
    std::vector<int64_t> first(rank, -1);
    for (size_t d = 0; d < rank; ++d) {
      std::vector<Taps> t = ir::resize_axis_taps(o, in.shape[d], os[d], plan.scale[d], plan.roi_start[d], plan.roi_end[d]);
      if (ir::resize_taps_identity(t, in.shape[d])) continue;
      first[d] = static_cast<int64_t>(table.size());
      table.insert(table.end(), t.begin(), t.end());
    }
    const Layout layout = f.outputs[0].layout;
    std::vector<size_t> order;
    for (size_t d = 0; d < rank; ++d) order.push_back(d);
    if (layout == Layout::kNHWC && rank == 4) order = {0, 2, 3, 1};
    const std::vector<int64_t> strides = in.logical_strides();
    ResizeParams p;
    p.rank = static_cast<int>(rank);
    p.n = shape_numel(os);
    for (size_t k = 0; k < rank; ++k) {
      p.out_dims[k] = os[order[k]];
      p.in_strides[k] = strides[order[k]];
      p.table[k] = first[order[k]];
    }
    const Taps* taps = table.empty() ? nullptr
                                     : static_cast<const Taps*>(services.upload(table.data(), table.size() * sizeof(Taps)));
    const DType storage = f.inputs[0].dtype;
    const size_t es = element_size(storage);
    if (o.mode == "nearest") {
      const uint64_t fill = ir::resize_fill_bits(o, storage);  // (tf_crop_and_resize's, in the storage type)
      return make_layer("kernel:resize_nearest", [=](const LayerIO& io, cudaStream_t stream) {
        if (p.n == 0) return;
        with_element(es, [&](auto tag) {
          using U = decltype(tag);
          U fill_value;
          std::memcpy(&fill_value, &fill, sizeof(U));
          resize_nearest_kernel<U><<<grid_for(p.n, kBlock, 4), kBlock, 0, stream>>>(
              static_cast<const U*>(io.inputs[0]), taps, static_cast<U*>(io.outputs[0]), fill_value, p);
          KILN_CUDA_CHECK_LAUNCH();
        });
      });
    }
    const float extrapolation = o.extrapolation;
    return make_layer("kernel:resize_" + o.mode, [=](const LayerIO& io, cudaStream_t stream) {
      if (p.n == 0) return;
      if (storage == DType::kFloat16)
        resize_interp_kernel<__half><<<grid_for(p.n, kBlock, 4), kBlock, 0, stream>>>(
            static_cast<const __half*>(io.inputs[0]), taps, static_cast<__half*>(io.outputs[0]), extrapolation, p);
      else
        resize_interp_kernel<float><<<grid_for(p.n, kBlock, 4), kBlock, 0, stream>>>(
            static_cast<const float*>(io.inputs[0]), taps, static_cast<float*>(io.outputs[0]), extrapolation, p);
      KILN_CUDA_CHECK_LAUNCH();
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
