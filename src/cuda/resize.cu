// CUDA layer of Resize: nearest (any dtype, moved by element size), linear and cubic (float32,
// stored as float32 or float16, computed in float32), any rank, with every
// coordinate_transformation_mode, nearest_mode, exclude_outside, extrapolation_value and
// cubic_coeff_a the CPU kernel handles; antialias is refused, as on the CPU.
//
// roi, scales and sizes must be constants: the host computes, per resized axis and output
// index, the source taps (up to 4 indices and weights, or "outside" for tf_crop_and_resize)
// exactly as the CPU kernel does, and uploads them. The kernel reads, per output element,
// the taps of each resized axis and sums their product (the CPU runs one separable pass per
// axis instead; the results agree to float32 rounding). Axes whose taps are the identity are
// read directly. A rank-4 input stored kNHWC is read through its logical strides and the
// output is written kNHWC too.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cuda/check.h"
#include "cuda/device_math.cuh"
#include "cuda/engine.h"
#include "ops/resize_params.h"

namespace kiln::cuda {

namespace {

constexpr int kBlock = 256;

// --- host: the taps, as the CPU kernel (src/cpu/resize.cc) computes them ----------------------

struct Options {
  std::string mode, ctm, nearest;
  double cubic_a = -0.75;
  bool exclude_outside = false;
  float extrapolation = 0.f;
};

Options options_of(const ir::Node& node) {
  const ir::Attributes& a = node.attrs;
  Options o;
  o.mode = a.get_string("mode", "nearest");
  o.ctm = a.get_string("coordinate_transformation_mode", "half_pixel");
  o.nearest = a.get_string("nearest_mode", "round_prefer_floor");
  o.cubic_a = a.get_float("cubic_coeff_a", -0.75f);
  o.exclude_outside = a.get_int("exclude_outside", 0) != 0;
  o.extrapolation = a.get_float("extrapolation_value", 0.f);
  return o;
}

double source_coord(const Options& o, int64_t j, int64_t in_len, double scale, double roi_s, double roi_e) {
  double x = static_cast<double>(j);
  double out_len = static_cast<double>(in_len) * scale;
  if (o.ctm == "asymmetric") return x / scale;
  if (o.ctm == "align_corners") return out_len == 1 ? 0.0 : x * static_cast<double>(in_len - 1) / (out_len - 1);
  if (o.ctm == "pytorch_half_pixel") return out_len > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (o.ctm == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  if (o.ctm == "tf_crop_and_resize") {
    double span = static_cast<double>(in_len - 1);
    return out_len > 1 ? roi_s * span + x * (roi_e - roi_s) * span / (out_len - 1) : 0.5 * (roi_s + roi_e) * span;
  }
  if (o.ctm == "half_pixel_symmetric") {
    double adjustment = std::floor(out_len) / out_len;
    double offset = static_cast<double>(in_len) / 2.0 * (1.0 - adjustment);
    return offset + (x + 0.5) / scale - 0.5;
  }
  return (x + 0.5) / scale - 0.5;  // half_pixel
}

int64_t nearest_index(const Options& o, double x) {
  double f = std::floor(x);
  if (o.nearest == "floor") return static_cast<int64_t>(f);
  if (o.nearest == "ceil") return static_cast<int64_t>(std::ceil(x));
  if (x - f == 0.5) return static_cast<int64_t>(o.nearest == "round_prefer_ceil" ? f + 1 : f);
  return static_cast<int64_t>(std::round(x));
}

// One output index's taps along one axis (the device table's entry).
struct Taps {
  int64_t idx[4] = {0, 0, 0, 0};
  float w[4] = {0, 0, 0, 0};
  int32_t n = 0;
  int32_t outside = 0;
};

std::vector<Taps> axis_taps(const Options& o, int64_t in_len, int64_t out_len, double scale, double roi_s, double roi_e) {
  std::vector<Taps> taps(static_cast<size_t>(out_len));
  auto clamp = [in_len](int64_t i) { return std::min(std::max<int64_t>(i, 0), in_len - 1); };
  for (int64_t j = 0; j < out_len; ++j) {
    Taps& t = taps[static_cast<size_t>(j)];
    double x = source_coord(o, j, in_len, scale, roi_s, roi_e);
    if (o.ctm == "tf_crop_and_resize" && (x < 0 || x > static_cast<double>(in_len - 1))) {
      t.outside = 1;
      continue;
    }
    if (o.mode == "nearest") {
      t.n = 1;
      t.idx[0] = clamp(nearest_index(o, x));
      t.w[0] = 1.f;
    } else if (o.mode == "linear") {
      x = std::min(std::max(x, 0.0), static_cast<double>(in_len - 1));
      int64_t i0 = static_cast<int64_t>(std::floor(x));
      double r = x - static_cast<double>(i0);
      t.n = 2;
      t.idx[0] = clamp(i0);
      t.idx[1] = clamp(i0 + 1);
      t.w[0] = static_cast<float>(1.0 - r);
      t.w[1] = static_cast<float>(r);
    } else {  // cubic (Keys), neighbours i0-1 .. i0+2 with edge padding
      int64_t i0 = static_cast<int64_t>(std::floor(x));
      double r = x - static_cast<double>(i0), a = o.cubic_a;
      double d[4] = {r + 1, r, 1 - r, 2 - r};
      double sum = 0, w[4];
      for (int k = 0; k < 4; ++k) {
        double s = d[k];
        w[k] = s <= 1 ? ((a + 2) * s - (a + 3)) * s * s + 1 : ((a * s - 5 * a) * s + 8 * a) * s - 4 * a;
        int64_t i = i0 - 1 + k;
        if (o.exclude_outside && (i < 0 || i >= in_len)) w[k] = 0;
        sum += w[k];
      }
      t.n = 4;
      for (int k = 0; k < 4; ++k) {
        t.idx[k] = clamp(i0 - 1 + k);
        t.w[k] = static_cast<float>(o.exclude_outside && sum != 0 ? w[k] / sum : w[k]);
      }
    }
  }
  return taps;
}

bool is_identity(const std::vector<Taps>& taps, int64_t in_len) {
  if (static_cast<int64_t>(taps.size()) != in_len) return false;
  for (size_t j = 0; j < taps.size(); ++j) {
    const Taps& t = taps[j];
    if (t.outside) return false;
    for (int k = 0; k < t.n; ++k)
      if (t.w[k] != 0.f && !(t.idx[k] == static_cast<int64_t>(j) && t.w[k] == 1.f)) return false;
  }
  return true;
}

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
    const Options o = options_of(r.node);
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
      std::vector<Taps> t = axis_taps(o, in.shape[d], os[d], plan.scale[d], plan.roi_start[d], plan.roi_end[d]);
      if (is_identity(t, in.shape[d])) continue;
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
      // The fill for tf_crop_and_resize: extrapolation_value for float32 tensors, else zeros.
      uint64_t fill = 0;
      if (r.input_dtypes[0] == DType::kFloat32) {
        Tensor v = Tensor::scalar<float>(o.extrapolation);
        if (storage != DType::kFloat32) v = convert_constant(v, Format{storage, Layout::kLinear});
        std::memcpy(&fill, v.raw(), es);
      }
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
