// CUDA layers of the elementwise unary ops (src/ir/unary_ops.h: their table, and the float math
// the CPU kernels compute too) and of BatchNormalization in inference mode.
//
// Unary ops are layout-agnostic: the output has the input's format and the kernel walks
// physical memory, so a kNHWC input stays kNHWC. Float ops compute in float32 whatever the
// storage (float32, float16, bfloat16); Abs/Neg/Sign also run on signed integers, Not on
// bool, IsNaN/IsInf read whatever float storage their input already has (a float32 graph
// input converted to float16 would turn 1e30 into inf). Formulas and NaN behaviour follow
// the CPU kernels' (one definition, ir::unary_float).
//
// BatchNormalization: y = x * s[c] + t[c] with s = scale / sqrt(var + eps), t = B - mean * s,
// folded in double on the host when the four parameters are constants (as the CPU does), else
// by a small kernel into the workspace on every run. c = logical dim 1, any layout.
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "ir/unary_ops.h"

namespace kiln::cuda {

namespace {

// ---- storage <-> compute ---------------------------------------------------------------

// V elements moved as one aligned access.
template <class T, int V> struct alignas(sizeof(T) * V) Pack { T v[V]; };

template <class In, class Out> constexpr int vec_width() {
  constexpr size_t widest = sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out);
  constexpr int v = static_cast<int>(16 / widest);
  return v > 8 ? 8 : (v < 1 ? 1 : v);
}

template <size_t kBytes> __device__ __forceinline__ bool aligned_to(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kBytes == 0;
}

// y[i] = f(x[i]) over n elements of physical memory; vector accesses when both pointers allow.
template <class In, class Out, class F>
__global__ void map_kernel(F f, const In* __restrict__ x, Out* __restrict__ y, int64_t n) {
  constexpr int V = vec_width<In, Out>();
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t tid = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const bool vec = aligned_to<sizeof(In) * V>(x) && aligned_to<sizeof(Out) * V>(y);
  const int64_t nv = vec ? n / V : 0;
  for (int64_t v = tid; v < nv; v += stride) {
    const Pack<In, V> a = reinterpret_cast<const Pack<In, V>*>(x)[v];
    Pack<Out, V> b;
#pragma unroll
    for (int j = 0; j < V; ++j) b.v[j] = from_compute<Out>(f(to_compute(a.v[j])));
    reinterpret_cast<Pack<Out, V>*>(y)[v] = b;
  }
  for (int64_t i = nv * V + tid; i < n; i += stride) y[i] = from_compute<Out>(f(to_compute(x[i])));
}

template <class In, class Out, class F>
void launch_map(const F& f, const void* x, void* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  constexpr int V = vec_width<In, Out>();
  map_kernel<In, Out, F><<<grid_for(n, 256, V), 256, 0, stream>>>(f, static_cast<const In*>(x), static_cast<Out*>(y), n);
  KILN_CUDA_CHECK_LAUNCH();
}

// ---- the ops ---------------------------------------------------------------------------

// The float math of src/ir/unary_ops.h, which the CPU kernels compute too.
template <ir::UnaryOp kOp>
struct FloatFn {
  ir::UnaryParams p;
  __device__ __forceinline__ float operator()(float x) const { return ir::unary_float<kOp>(x, p); }
};

// Abs / Neg / Sign of signed integers; negation wraps (two's complement) as on the CPU.
template <class T>
struct IntFn {
  int op;  // 0 Abs, 1 Neg, 2 Sign
  __device__ __forceinline__ T operator()(T x) const {
    using U = std::make_unsigned_t<T>;
    const T neg = static_cast<T>(U(0) - static_cast<U>(x));
    if (op == 0) return x < 0 ? neg : x;
    if (op == 1) return neg;
    return static_cast<T>(x > 0 ? 1 : (x < 0 ? -1 : 0));
  }
};

struct NotFn {
  __device__ __forceinline__ uint8_t operator()(uint8_t x) const { return x ? 0 : 1; }
};

struct BitwiseNotFn {
  template <class T> __device__ __forceinline__ T operator()(T x) const { return static_cast<T>(~x); }
};

// Shrink, in double as the CPU kernel computes it.
struct ShrinkFn {
  double lambd, bias;
  template <class T> __device__ __forceinline__ T operator()(T x) const {
    const double v = static_cast<double>(x);
    return static_cast<T>(v < -lambd ? v + bias : v > lambd ? v - bias : 0.0);
  }
};

struct IsNaNFn {
  __device__ __forceinline__ uint8_t operator()(float x) const { return isnan(x) ? 1 : 0; }
};

struct IsInfFn {
  bool pos, neg;
  __device__ __forceinline__ uint8_t operator()(float x) const {
    return isinf(x) && ((x > 0.f && pos) || (x < 0.f && neg)) ? 1 : 0;
  }
};

// The C++ storage type of a float storage dtype.
template <class Fn>
void dispatch_float_storage(DType d, Fn&& fn) {
  switch (d) {
    case DType::kFloat32: fn(float{}); return;
    case DType::kFloat16: fn(__half{}); return;
    case DType::kBFloat16: fn(__nv_bfloat16{}); return;
    default: throw Error(ErrorKind::kInternal, "no float kernel for storage " + to_string(d));
  }
}

bool is_float_logical(DType d) { return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16; }

template <ir::UnaryOp kOp>
EnqueueFn float_enqueue(DType storage, ir::UnaryParams p, int64_t n) {
  EnqueueFn fn;
  dispatch_float_storage(storage, [&](auto tag) {
    using T = decltype(tag);
    fn = [p, n](const LayerIO& io, cudaStream_t stream) {
      launch_map<T, T>(FloatFn<kOp>{p}, io.inputs[0], io.outputs[0], n, stream);
    };
  });
  return fn;
}

EnqueueFn float_enqueue_for(ir::UnaryOp op, DType storage, ir::UnaryParams p, int64_t n) {
  return ir::with_float_unary_op(op, [&](auto k) { return float_enqueue<decltype(k)::value>(storage, p, n); });
}

std::string dtype_list_reason(DType d, const char* supported) {
  return "input type " + to_string(d) + " is not supported (supported: " + supported + ")";
}

int64_t output_elements(const LayerRequest& r) { return shape_numel(r.output_shapes.at(0)); }

// The format of input 0 with its layout kept; the output gets the same layout.
LayerFormats same_layout_formats(const LayerRequest& r, DType in_storage, DType out_storage) {
  LayerFormats f;
  const Layout layout = r.inputs[0]->rank() == 4 ? r.inputs[0]->format.layout : Layout::kLinear;
  f.inputs.assign(r.inputs.size(), Format{});
  f.inputs[0] = Format{in_storage, layout};
  f.outputs.push_back(Format{out_storage, r.output_shapes[0].size() == 4 ? layout : Layout::kLinear});
  return f;
}

// ---- BatchNormalization ------------------------------------------------------------------

// y = x * s[c] + t[c] over physical memory seen as rows of `row` elements: with the channel
// innermost (kNHWC, or nothing after dim 1) a row is one pixel's channels and c = column;
// otherwise a row is one channel's plane and c = row % channels. Each thread takes V
// consecutive elements of a row (vector access when whole and aligned).
struct BnGeometry {
  int64_t groups = 0, row = 1, per_row = 1, channels = 1;
  bool channel_last = false, narrow = true;
  FastDiv per_row_div, channel_div;
};

template <class T>
__global__ void batchnorm_kernel(const T* __restrict__ x, T* __restrict__ y, const float* __restrict__ s,
                                 const float* __restrict__ t, BnGeometry geo) {
  constexpr int V = vec_width<T, T>();
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t g = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; g < geo.groups; g += stride) {
    int64_t r, c0;
    if (geo.narrow) {
      const uint32_t rr = fast_div(geo.per_row_div, static_cast<uint32_t>(g));
      r = rr;
      c0 = geo.channel_last ? 0 : rr - fast_div(geo.channel_div, rr) * static_cast<uint32_t>(geo.channels);
    } else {
      r = g / geo.per_row;
      c0 = geo.channel_last ? 0 : r % geo.channels;
    }
    const int64_t col = (g - r * geo.per_row) * V;
    const int64_t i = r * geo.row + col;
    const int cnt = geo.row - col < V ? static_cast<int>(geo.row - col) : V;
    const bool vec = cnt == V && aligned_to<sizeof(T) * V>(x + i) && aligned_to<sizeof(T) * V>(y + i);
    Pack<T, V> in;
    if (vec) {
      in = *reinterpret_cast<const Pack<T, V>*>(x + i);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) in.v[j] = x[i + (j < cnt ? j : 0)];
    }
    Pack<T, V> out;
    if (geo.channel_last && vec && aligned_to<sizeof(float) * V>(s + col) && aligned_to<sizeof(float) * V>(t + col)) {
      const Pack<float, V> sv = *reinterpret_cast<const Pack<float, V>*>(s + col);
      const Pack<float, V> tv = *reinterpret_cast<const Pack<float, V>*>(t + col);
#pragma unroll
      for (int j = 0; j < V; ++j) out.v[j] = from_compute<T>(to_compute(in.v[j]) * sv.v[j] + tv.v[j]);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int64_t c = geo.channel_last ? (col + (j < cnt ? j : 0)) : c0;
        out.v[j] = from_compute<T>(to_compute(in.v[j]) * s[c] + t[c]);
      }
    }
    if (vec) {
      *reinterpret_cast<Pack<T, V>*>(y + i) = out;
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (j < cnt) y[i + j] = out.v[j];
    }
  }
}

__device__ __forceinline__ double load_param(const void* p, int dtype, int64_t i) {
  switch (dtype) {
    case static_cast<int>(DType::kFloat16): return __half2float(static_cast<const __half*>(p)[i]);
    case static_cast<int>(DType::kBFloat16): return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case static_cast<int>(DType::kFloat64): return static_cast<const double*>(p)[i];
    default: return static_cast<const float*>(p)[i];
  }
}

struct BnParams {
  const void* p[4];  // scale, B, mean, var
  int dtype[4];
};

__global__ void batchnorm_fold_kernel(BnParams params, float* s, float* t, int64_t channels, double epsilon) {
  for (int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    const double sc = load_param(params.p[0], params.dtype[0], c) /
                      sqrt(load_param(params.p[3], params.dtype[3], c) + epsilon);
    s[c] = static_cast<float>(sc);
    t[c] = static_cast<float>(load_param(params.p[1], params.dtype[1], c) - load_param(params.p[2], params.dtype[2], c) * sc);
  }
}

std::unique_ptr<Layer> create_batchnorm(const LayerRequest& r, const LayerFormats& f, BuildServices& services) {
  const ir::Node& node = r.node;
  const float epsilon = node.attrs.get_float("epsilon", 1e-5f);
  const TensorSpec x{r.input_shape(0), f.inputs[0]};
  const int64_t n = x.elements();
  const int64_t channels = x.shape.at(1);
  int64_t inner = 1;
  if (x.format.layout != Layout::kNHWC || x.rank() != 4)
    for (int d = 2; d < x.rank(); ++d) inner *= x.shape[static_cast<size_t>(d)];
  const DType storage = f.inputs[0].dtype;

  bool all_constant = true;
  for (size_t i = 1; i <= 4; ++i) all_constant = all_constant && r.is_constant(i);
  const float* s = nullptr;
  const float* t = nullptr;
  BnParams params{};
  if (all_constant) {
    std::vector<float> hs(static_cast<size_t>(channels)), ht(static_cast<size_t>(channels));
    const Tensor &scale = *r.constants[1], &bias = *r.constants[2], &mean = *r.constants[3], &var = *r.constants[4];
    for (int64_t c = 0; c < channels; ++c) {
      const double sc = scale.value_as_double(c) / std::sqrt(var.value_as_double(c) + static_cast<double>(epsilon));
      hs[static_cast<size_t>(c)] = static_cast<float>(sc);
      ht[static_cast<size_t>(c)] = static_cast<float>(bias.value_as_double(c) - mean.value_as_double(c) * sc);
    }
    if (channels > 0) {
      s = static_cast<const float*>(services.upload(hs.data(), hs.size() * sizeof(float)));
      t = static_cast<const float*>(services.upload(ht.data(), ht.size() * sizeof(float)));
    }
  } else {
    for (int i = 0; i < 4; ++i) params.dtype[i] = static_cast<int>(f.inputs[static_cast<size_t>(i) + 1].dtype);
  }
  const size_t workspace = all_constant ? 0 : static_cast<size_t>(2 * channels) * sizeof(float);
  const bool channel_last = x.format.layout == Layout::kNHWC || inner == 1;
  EnqueueFn fn;
  dispatch_float_storage(storage, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = vec_width<T, T>();
    BnGeometry geo;
    geo.channels = channels > 0 ? channels : 1;
    geo.channel_last = channel_last;
    geo.row = channel_last ? geo.channels : (inner > 0 ? inner : 1);
    geo.per_row = (geo.row + V - 1) / V;
    geo.groups = n / geo.row * geo.per_row;
    geo.narrow = n < (int64_t{1} << 31);
    if (geo.narrow) {
      geo.per_row_div = make_fast_div(static_cast<uint32_t>(geo.per_row));
      geo.channel_div = make_fast_div(static_cast<uint32_t>(geo.channels));
    }
    fn = [=](const LayerIO& io, cudaStream_t stream) {
      if (n == 0) return;
      const float* ps = s;
      const float* pt = t;
      if (!all_constant) {
        float* ws = static_cast<float*>(io.workspace);
        BnParams run = params;
        for (int i = 0; i < 4; ++i) run.p[i] = io.inputs[static_cast<size_t>(i) + 1];
        batchnorm_fold_kernel<<<grid_for(channels), 256, 0, stream>>>(run, ws, ws + channels, channels,
                                                                     static_cast<double>(epsilon));
        KILN_CUDA_CHECK_LAUNCH();
        ps = ws;
        pt = ws + channels;
      }
      batchnorm_kernel<T><<<grid_for(geo.groups, 256, 2), 256, 0, stream>>>(
          static_cast<const T*>(io.inputs[0]), static_cast<T*>(io.outputs[0]), ps, pt, geo);
      KILN_CUDA_CHECK_LAUNCH();
    };
  });
  std::string tactic = std::string("kernel:batchnorm") + (x.format.layout == Layout::kNHWC ? " nhwc" : "") +
                       (all_constant ? "" : " runtime-params");
  return make_layer(std::move(tactic), std::move(fn), workspace);
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(unary) {
  // Float functions (Abs/Neg/Sign also on signed integers).
  for (const ir::UnaryOpInfo& u : ir::kUnaryOps) {
    if (!ir::has_float_math(u.op)) continue;
    const bool signed_ints = ir::takes_signed_integers(u.op);
    LayerEntry e;
    e.op = u.name;
    e.check = [signed_ints](const LayerRequest& r) -> std::string {
      if (!r.has_input(0)) return "input X is missing";
      DType d = r.input_dtypes[0];
      if (is_float_logical(d)) return "";
      if (signed_ints && (d == DType::kInt8 || d == DType::kInt16 || d == DType::kInt32 || d == DType::kInt64)) return "";
      return dtype_list_reason(d, signed_ints ? "float32, float16, bfloat16, int8, int16, int32, int64"
                                              : "float32, float16, bfloat16");
    };
    e.formats = [](const LayerRequest& r) {
      DType storage = r.storage_of(r.input_dtypes[0]);
      return same_layout_formats(r, storage, storage);
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) -> std::unique_ptr<Layer> {
      const DType storage = f.inputs[0].dtype;
      const int64_t n = output_elements(r);
      const std::string& op = r.node.op;
      if (!is_float_logical(storage)) {
        const int which = op == "Abs" ? 0 : (op == "Neg" ? 1 : 2);
        EnqueueFn fn;
        auto make = [&](auto tag) {
          using T = decltype(tag);
          fn = [which, n](const LayerIO& io, cudaStream_t stream) {
            launch_map<T, T>(IntFn<T>{which}, io.inputs[0], io.outputs[0], n, stream);
          };
        };
        switch (storage) {
          case DType::kInt8: make(int8_t{}); break;
          case DType::kInt16: make(int16_t{}); break;
          case DType::kInt32: make(int32_t{}); break;
          case DType::kInt64: make(int64_t{}); break;
          default: throw r.node.error(ErrorKind::kUnsupported, "input type " + to_string(storage) + " is not supported");
        }
        return make_layer("kernel:unary " + op + " " + to_string(storage), std::move(fn));
      }
      ir::UnaryParams p;
      const ir::UnaryOp uop = ir::float_unary_op_of(r.node, p);
      return make_layer("kernel:unary " + op + " " + to_string(storage), float_enqueue_for(uop, storage, p, n));
    };
    e.dtypes = signed_ints ? "float32, float16, bfloat16, int8, int16, int32, int64" : "float32, float16, bfloat16";
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "Not";
    e.check = [](const LayerRequest& r) -> std::string {
      if (!r.has_input(0)) return "input X is missing";
      return r.input_dtypes[0] == DType::kBool ? "" : dtype_list_reason(r.input_dtypes[0], "bool");
    };
    e.formats = [](const LayerRequest& r) { return same_layout_formats(r, DType::kBool, DType::kBool); };
    e.create = [](const LayerRequest& r, const LayerFormats&, BuildServices&) {
      const int64_t n = output_elements(r);
      return make_layer("kernel:unary Not", [n](const LayerIO& io, cudaStream_t stream) {
        launch_map<uint8_t, uint8_t>(NotFn{}, io.inputs[0], io.outputs[0], n, stream);
      });
    };
    e.dtypes = "bool";
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "BitwiseNot";
    e.check = [](const LayerRequest& r) -> std::string {
      if (!r.has_input(0)) return "input X is missing";
      const DType d = r.input_dtypes[0];
      return is_integer(d) && d != DType::kBool ? "" : dtype_list_reason(d, "int8..int64, uint8..uint64");
    };
    e.formats = [](const LayerRequest& r) { return same_layout_formats(r, r.input_dtypes[0], r.input_dtypes[0]); };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) -> std::unique_ptr<Layer> {
      const int64_t n = output_elements(r);
      EnqueueFn fn;
      auto make = [&](auto tag) {
        using T = decltype(tag);
        fn = [n](const LayerIO& io, cudaStream_t stream) { launch_map<T, T>(BitwiseNotFn{}, io.inputs[0], io.outputs[0], n, stream); };
      };
      switch (f.inputs[0].dtype) {
        case DType::kInt8: case DType::kUInt8: make(uint8_t{}); break;  // the same bits either way
        case DType::kInt16: case DType::kUInt16: make(uint16_t{}); break;
        case DType::kInt32: case DType::kUInt32: make(uint32_t{}); break;
        case DType::kInt64: case DType::kUInt64: make(uint64_t{}); break;
        default: throw r.node.error(ErrorKind::kUnsupported, "input type " + to_string(f.inputs[0].dtype) + " is not supported");
      }
      return make_layer("kernel:unary BitwiseNot " + to_string(f.inputs[0].dtype), std::move(fn));
    };
    e.dtypes = "int8..int64, uint8..uint64";
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "Shrink";
    e.check = [](const LayerRequest& r) -> std::string {
      if (!r.has_input(0)) return "input X is missing";
      const DType d = r.input_dtypes[0];
      return d == DType::kFloat32 || d == DType::kFloat64 ? "" : dtype_list_reason(d, "float32, float64");
    };
    e.formats = [](const LayerRequest& r) {
      const DType storage = r.storage_of(r.input_dtypes[0]);
      return same_layout_formats(r, storage, storage);
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) -> std::unique_ptr<Layer> {
      const int64_t n = output_elements(r);
      const ShrinkFn shrink{r.node.attrs.get_float("lambd", 0.5f), r.node.attrs.get_float("bias", 0.f)};
      EnqueueFn fn;
      auto make = [&](auto tag) {
        using T = decltype(tag);
        fn = [n, shrink](const LayerIO& io, cudaStream_t stream) { launch_map<T, T>(shrink, io.inputs[0], io.outputs[0], n, stream); };
      };
      if (f.inputs[0].dtype == DType::kFloat64) make(double{});
      else dispatch_float_storage(f.inputs[0].dtype, make);
      return make_layer("kernel:unary Shrink " + to_string(f.inputs[0].dtype), std::move(fn));
    };
    e.dtypes = "float32, float64";
    registry.add(std::move(e));
  }
  for (const char* op : {"IsNaN", "IsInf"}) {
    LayerEntry e;
    e.op = op;
    e.check = [](const LayerRequest& r) -> std::string {
      if (!r.has_input(0)) return "input X is missing";
      return is_float_logical(r.input_dtypes[0]) ? "" : dtype_list_reason(r.input_dtypes[0], "float32, float16, bfloat16");
    };
    e.formats = [](const LayerRequest& r) {
      // Read the storage the input already has: converting float32 to float16 first would
      // turn large finite values into inf.
      DType storage = r.storage_of(r.input_dtypes[0]);
      if (!r.is_constant(0) && is_float_logical(r.inputs[0]->format.dtype)) storage = r.inputs[0]->format.dtype;
      if (r.is_constant(0)) storage = r.input_dtypes[0];
      return same_layout_formats(r, storage, DType::kBool);
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const int64_t n = output_elements(r);
      const bool is_nan = r.node.op == "IsNaN";
      const bool pos = r.node.attrs.get_int("detect_positive", 1) != 0;
      const bool neg = r.node.attrs.get_int("detect_negative", 1) != 0;
      EnqueueFn fn;
      dispatch_float_storage(f.inputs[0].dtype, [&](auto tag) {
        using T = decltype(tag);
        fn = [=](const LayerIO& io, cudaStream_t stream) {
          if (is_nan) launch_map<T, uint8_t>(IsNaNFn{}, io.inputs[0], io.outputs[0], n, stream);
          else launch_map<T, uint8_t>(IsInfFn{pos, neg}, io.inputs[0], io.outputs[0], n, stream);
        };
      });
      return make_layer("kernel:unary " + r.node.op + " " + to_string(f.inputs[0].dtype), std::move(fn));
    };
    e.dtypes = "float32, float16, bfloat16";
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "BatchNormalization";
    e.check = [](const LayerRequest& r) -> std::string {
      if (!r.has_input(0)) return "input X is missing";
      if (!is_float_logical(r.input_dtypes[0])) return dtype_list_reason(r.input_dtypes[0], "float32, float16, bfloat16");
      if (r.input_shape(0).size() < 2) return "X must have rank >= 2";
      if (r.node.attrs.get_int("training_mode", 0) != 0) return "training_mode=1 is not supported";
      for (size_t i = 1; i <= 4; ++i) {
        if (!r.has_input(i)) return "input " + std::to_string(i) + " is missing";
        DType d = r.input_dtypes[i];
        if (!is_float_logical(d) && d != DType::kFloat64)
          return "parameter type " + to_string(d) + " is not supported";
      }
      return "";
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f = same_layout_formats(r, r.storage_of(r.input_dtypes[0]), r.storage_of(r.input_dtypes[0]));
      // Constant parameters are folded on the host. When any is a runtime tensor all four are
      // folded on the device, read in their logical dtype (float32 kept for precision).
      bool all_constant = true;
      for (size_t i = 1; i <= 4; ++i) all_constant = all_constant && r.is_constant(i);
      if (!all_constant)
        for (size_t i = 1; i <= 4; ++i) f.inputs[i] = Format{r.input_dtypes[i], Layout::kLinear};
      return f;
    };
    e.create = create_batchnorm;
    e.dtypes = "float32, float16, bfloat16";
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cuda
