// CUDA layers of BitCast and Dropout (copies) and of Cast and CastLike between float16, bfloat16, float32, float64, all integer
// types and bool, bit for bit as the CPU kernel (src/cpu/cast.cc):
//   - anything to bool is "!= 0", bool to anything is 0 or 1;
//   - float/double to an integer truncates toward zero, NaN gives 0, out-of-range values
//     saturate to the type's bounds (compared in double);
//   - float16/bfloat16 go through float32 both ways; float32 to float16/bfloat16 rounds to
//     nearest even, overflow gives inf, NaN keeps its sign and becomes quiet (the CPU's
//     float_to_half / float_to_bfloat16, ported below);
//   - same storage type in and out is a copy;
//   - the small types, a byte per element (ir/small_types.h), in the CPU kernel's steps: a small
//     float is decoded to float32 and encoded from float32 (ir/small_float.h, the CPU's own
//     arithmetic; `saturate` as the node says), a sub-byte integer is read as int8/uint8, and
//     anything cast to one is truncated toward zero (NaN and infinities: 0) and wrapped to its bits.
// Storage dtypes come from the formats: under Precision::kFp16 a logical float32 tensor may be
// stored float16 (then a Cast float32 -> float16 is a copy), and the input is read in
// whatever storage and layout it already has. The op is per element, so the output keeps the
// input's layout.
#include <limits>
#include <string>
#include <type_traits>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "ir/small_float.h"
#include "ir/small_types.h"

namespace kiln::cuda {

namespace {

// Storage tags: the C++ type in memory and how it converts.
template <class T> struct Plain { using S = T; };
struct BoolTag { using S = uint8_t; };
struct HalfTag { using S = uint16_t; };
struct BHalfTag { using S = uint16_t; };

template <class Tag> constexpr bool is_half_tag = std::is_same_v<Tag, HalfTag> || std::is_same_v<Tag, BHalfTag>;

__device__ __forceinline__ uint16_t float_to_half_bits(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (absx < 0x38800000u) {  // subnormal or zero in half
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;
    uint32_t half_m = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t mid = 1u << (shift - 1u);
    if (rem > mid || (rem == mid && (half_m & 1u))) ++half_m;
    return static_cast<uint16_t>(sign | half_m);
  }
  const uint32_t e = (absx >> 23) - 127u + 15u;
  const uint32_t m = absx & 0x7fffffu;
  uint32_t h = (e << 10) | (m >> 13);
  const uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // round to nearest even
  return static_cast<uint16_t>(sign | h);
}

__device__ __forceinline__ uint16_t float_to_bfloat16_bits(float f) {
  const uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

// The CPU's convert<S, float> (and the 16-bit float decodes).
template <class Tag> __device__ __forceinline__ float to_float(typename Tag::S v) {
  if constexpr (std::is_same_v<Tag, HalfTag>) return __half2float(__ushort_as_half(v));
  else if constexpr (std::is_same_v<Tag, BHalfTag>) return __uint_as_float(static_cast<uint32_t>(v) << 16);
  else if constexpr (std::is_same_v<Tag, BoolTag>) return v ? 1.f : 0.f;
  else return static_cast<float>(v);
}

// double -> integer D: NaN 0, saturating, else truncation toward zero.
template <class D> __device__ __forceinline__ D saturate_to(double v) {
  if (isnan(v)) return D(0);
  if (v <= static_cast<double>(std::numeric_limits<D>::lowest())) return std::numeric_limits<D>::lowest();
  if (v >= static_cast<double>(std::numeric_limits<D>::max())) return std::numeric_limits<D>::max();
  return static_cast<D>(v);
}

// The CPU's convert<float, D> (and the 16-bit float encodes).
template <class Tag> __device__ __forceinline__ typename Tag::S from_float(float f) {
  using D = typename Tag::S;
  if constexpr (std::is_same_v<Tag, HalfTag>) return float_to_half_bits(f);
  else if constexpr (std::is_same_v<Tag, BHalfTag>) return float_to_bfloat16_bits(f);
  else if constexpr (std::is_same_v<Tag, BoolTag>) return f != 0.f ? 1 : 0;
  else if constexpr (std::is_integral_v<D>) return saturate_to<D>(static_cast<double>(f));
  else return static_cast<D>(f);
}

template <class From, class To>
__device__ __forceinline__ typename To::S cast_value(typename From::S v) {
  using S = typename From::S;
  using D = typename To::S;
  if constexpr (is_half_tag<From> || is_half_tag<To>) {
    return from_float<To>(to_float<From>(v));
  } else if constexpr (std::is_same_v<To, BoolTag>) {
    if constexpr (std::is_same_v<From, BoolTag>) return v ? 1 : 0;
    else return v != S(0) ? 1 : 0;
  } else if constexpr (std::is_same_v<From, BoolTag>) {
    return v ? D(1) : D(0);
  } else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
    return saturate_to<D>(static_cast<double>(v));
  } else {
    return static_cast<D>(v);
  }
}

template <class T, int V> struct alignas(sizeof(T) * V) Pack { T v[V]; };

template <class A, class B> constexpr int cast_vec_width() {
  constexpr size_t widest = sizeof(A) > sizeof(B) ? sizeof(A) : sizeof(B);
  constexpr int v = static_cast<int>(16 / widest);
  return v > 8 ? 8 : (v < 1 ? 1 : v);
}

template <class From, class To>
__global__ void cast_kernel(const typename From::S* __restrict__ x, typename To::S* __restrict__ y, int64_t n) {
  using S = typename From::S;
  using D = typename To::S;
  constexpr int V = cast_vec_width<S, D>();
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t tid = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const bool vec = reinterpret_cast<uintptr_t>(x) % (sizeof(S) * V) == 0 &&
                   reinterpret_cast<uintptr_t>(y) % (sizeof(D) * V) == 0;
  const int64_t nv = vec ? n / V : 0;
  for (int64_t v = tid; v < nv; v += stride) {
    const Pack<S, V> a = reinterpret_cast<const Pack<S, V>*>(x)[v];
    Pack<D, V> b;
#pragma unroll
    for (int j = 0; j < V; ++j) b.v[j] = cast_value<From, To>(a.v[j]);
    reinterpret_cast<Pack<D, V>*>(y)[v] = b;
  }
  for (int64_t i = nv * V + tid; i < n; i += stride) y[i] = cast_value<From, To>(x[i]);
}

// ---- the small types -----------------------------------------------------------------------

// A small type's byte; SmallCast says which type it is.
struct SmallTag { using S = uint8_t; };

enum class SmallKind : uint8_t { kNone, kFloat, kSignedInt, kUnsignedInt };

struct SmallCast {
  SmallKind in = SmallKind::kNone, out = SmallKind::kNone;
  SmallFloatFormat in_format, out_format;
  int out_bits = 0;  // a sub-byte integer output's
  bool saturate = true;
};

SmallKind small_kind(DType d) {
  if (is_small_float(d)) return SmallKind::kFloat;
  if (d == DType::kInt4 || d == DType::kInt2) return SmallKind::kSignedInt;
  if (d == DType::kUInt4 || d == DType::kUInt2) return SmallKind::kUnsignedInt;
  return SmallKind::kNone;
}

// The input element as float32 (what a small float output is encoded from).
template <class From>
__device__ __forceinline__ float small_source_float(typename From::S v, const SmallCast& p) {
  if constexpr (std::is_same_v<From, SmallTag>) {
    if (p.in == SmallKind::kFloat) return small_float_decode(p.in_format, v);
    return p.in == SmallKind::kSignedInt ? static_cast<float>(static_cast<int8_t>(v)) : static_cast<float>(v);
  } else {
    return cast_value<From, Plain<float>>(v);
  }
}

// A float truncated toward zero as an integer; NaN and infinities give 0.
__device__ __forceinline__ int64_t truncated(double d) {
  if (!isfinite(d)) return 0;
  return static_cast<int64_t>(fmin(fmax(trunc(d), -9.2e18), 9.2e18));
}

// The input element as an integer (what a sub-byte integer output wraps).
template <class From>
__device__ __forceinline__ int64_t small_source_int(typename From::S v, const SmallCast& p) {
  using S = typename From::S;
  if constexpr (std::is_same_v<From, SmallTag>) {
    if (p.in == SmallKind::kFloat) return truncated(static_cast<double>(small_float_decode(p.in_format, v)));
    return p.in == SmallKind::kSignedInt ? static_cast<int64_t>(static_cast<int8_t>(v)) : static_cast<int64_t>(v);
  } else if constexpr (is_half_tag<From>) {
    return truncated(static_cast<double>(to_float<From>(v)));
  } else if constexpr (std::is_same_v<From, BoolTag>) {
    return v ? 1 : 0;
  } else if constexpr (std::is_floating_point_v<S>) {
    return truncated(static_cast<double>(v));
  } else {
    return static_cast<int64_t>(v);
  }
}

// The low bits of `v`, sign-extended for the signed types, as the byte a sub-byte integer is held in.
__device__ __forceinline__ uint8_t wrap_bits(int64_t v, const SmallCast& p) {
  const uint64_t mask = (uint64_t{1} << p.out_bits) - 1;
  uint64_t low = static_cast<uint64_t>(v) & mask;
  if (p.out == SmallKind::kSignedInt && (low >> (p.out_bits - 1))) low |= ~mask;
  return static_cast<uint8_t>(low);
}

// A small type's element cast to any other type.
template <class To>
__device__ __forceinline__ typename To::S small_to(uint8_t v, const SmallCast& p) {
  if (p.in == SmallKind::kFloat) return cast_value<Plain<float>, To>(small_float_decode(p.in_format, v));
  if (p.in == SmallKind::kSignedInt) return cast_value<Plain<int8_t>, To>(static_cast<int8_t>(v));
  return cast_value<Plain<uint8_t>, To>(v);
}

// Either side (or both) a small type: From or To is SmallTag.
template <class From, class To>
__global__ void small_cast_kernel(const typename From::S* __restrict__ x, typename To::S* __restrict__ y, int64_t n,
                                  SmallCast p) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (std::is_same_v<To, SmallTag>) {
      y[i] = p.out == SmallKind::kFloat ? small_float_encode(p.out_format, small_source_float<From>(x[i], p), p.saturate)
                                        : wrap_bits(small_source_int<From>(x[i], p), p);
    } else {
      y[i] = small_to<To>(x[i], p);
    }
  }
}

template <class Fn>
bool dispatch_tag(DType d, Fn&& fn) {
  switch (d) {
    case DType::kFloat32: fn(Plain<float>{}); return true;
    case DType::kFloat64: fn(Plain<double>{}); return true;
    case DType::kFloat16: fn(HalfTag{}); return true;
    case DType::kBFloat16: fn(BHalfTag{}); return true;
    case DType::kInt8: fn(Plain<int8_t>{}); return true;
    case DType::kInt16: fn(Plain<int16_t>{}); return true;
    case DType::kInt32: fn(Plain<int32_t>{}); return true;
    case DType::kInt64: fn(Plain<int64_t>{}); return true;
    case DType::kUInt8: fn(Plain<uint8_t>{}); return true;
    case DType::kUInt16: fn(Plain<uint16_t>{}); return true;
    case DType::kUInt32: fn(Plain<uint32_t>{}); return true;
    case DType::kUInt64: fn(Plain<uint64_t>{}); return true;
    case DType::kBool: fn(BoolTag{}); return true;
    default: return false;
  }
}

bool castable(DType d) { return small_kind(d) != SmallKind::kNone || dispatch_tag(d, [](auto) {}); }

// The layer of a cast with a small type on either side (or both).
std::unique_ptr<Layer> small_cast_layer(const LayerRequest& r, DType from, DType to, int64_t n) {
  SmallCast p;
  p.in = small_kind(from);
  p.out = small_kind(to);
  if (p.in == SmallKind::kFloat) p.in_format = small_float_format(from);
  if (p.out == SmallKind::kFloat) p.out_format = small_float_format(to);
  if (p.out == SmallKind::kSignedInt || p.out == SmallKind::kUnsignedInt) p.out_bits = packed_bits(to);
  p.saturate = r.node.attrs.get_int("saturate", 1) != 0;
  EnqueueFn fn;
  auto launcher = [&](auto from_tag, auto to_tag) {
    using From = decltype(from_tag);
    using To = decltype(to_tag);
    fn = [n, p](const LayerIO& io, cudaStream_t stream) {
      if (n <= 0) return;
      small_cast_kernel<From, To><<<grid_for(n, 256, 1), 256, 0, stream>>>(
          static_cast<const typename From::S*>(io.inputs[0]), static_cast<typename To::S*>(io.outputs[0]), n, p);
      KILN_CUDA_CHECK_LAUNCH();
    };
  };
  if (p.in != SmallKind::kNone) {
    if (p.out != SmallKind::kNone) launcher(SmallTag{}, SmallTag{});
    else dispatch_tag(to, [&](auto to_tag) { launcher(SmallTag{}, to_tag); });
  } else {
    dispatch_tag(from, [&](auto from_tag) { launcher(from_tag, SmallTag{}); });
  }
  if (!fn) throw r.node.error(ErrorKind::kUnsupported, "cannot cast " + to_string(from) + " to " + to_string(to));
  return make_layer("kernel:cast " + to_string(from) + "->" + to_string(to), std::move(fn));
}

// The storage a runtime input of logical dtype `logical` may have (its own dtype, or 16-bit
// floats for a logical float32 under fp16).
bool valid_storage(DType logical, DType storage) {
  if (storage == logical) return true;
  return logical == DType::kFloat32 && (storage == DType::kFloat16 || storage == DType::kBFloat16);
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(cast) {
  for (const char* op : {"Cast", "CastLike"}) {
    LayerEntry e;
    e.op = op;
    e.check = [](const LayerRequest& r) -> std::string {
      if (!r.has_input(0)) return "input is missing";
      const DType from = r.input_dtypes[0], to = r.output_dtypes.at(0);
      if (!castable(from)) return "cannot cast from " + to_string(from);
      if (!castable(to)) return "cannot cast to " + to_string(to);
      return "";
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs.resize(r.inputs.size());
      Format in{r.input_dtypes[0], Layout::kLinear};
      if (!r.is_constant(0)) {
        // Read the input as it is stored (no reformat in front of a cast).
        const Format& now = r.inputs[0]->format;
        if (valid_storage(r.input_dtypes[0], now.dtype)) in.dtype = now.dtype;
        if (r.inputs[0]->rank() == 4) in.layout = now.layout;
      }
      f.inputs[0] = in;
      // CastLike's target only lends its dtype; a runtime one is taken as it is stored.
      if (r.inputs.size() > 1 && r.has_input(1) && !r.is_constant(1)) f.inputs[1] = r.inputs[1]->format;
      const Layout out_layout = r.output_shapes[0].size() == 4 ? in.layout : Layout::kLinear;
      f.outputs.push_back(Format{r.storage_of(r.output_dtypes[0]), out_layout});
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) -> std::unique_ptr<Layer> {
      const DType from = f.inputs[0].dtype, to = f.outputs[0].dtype;
      const int64_t n = shape_numel(r.output_shapes[0]);
      if (from == to) {
        const size_t bytes = static_cast<size_t>(n) * element_size(to);
        return make_layer("kernel:cast copy " + to_string(to), [bytes](const LayerIO& io, cudaStream_t stream) {
          if (bytes)
            KILN_CUDA_CHECK(cudaMemcpyAsync(io.outputs[0], io.inputs[0], bytes, cudaMemcpyDeviceToDevice, stream));
        });
      }
      if (small_kind(from) != SmallKind::kNone || small_kind(to) != SmallKind::kNone)
        return small_cast_layer(r, from, to, n);
      EnqueueFn fn;
      dispatch_tag(from, [&](auto from_tag) {
        dispatch_tag(to, [&](auto to_tag) {
          using From = decltype(from_tag);
          using To = decltype(to_tag);
          fn = [n](const LayerIO& io, cudaStream_t stream) {
            if (n <= 0) return;
            constexpr int V = cast_vec_width<typename From::S, typename To::S>();
            cast_kernel<From, To><<<grid_for(n, 256, V), 256, 0, stream>>>(
                static_cast<const typename From::S*>(io.inputs[0]), static_cast<typename To::S*>(io.outputs[0]), n);
            KILN_CUDA_CHECK_LAUNCH();
          };
        });
      });
      if (!fn) throw r.node.error(ErrorKind::kUnsupported, "cannot cast " + to_string(from) + " to " + to_string(to));
      return make_layer("kernel:cast " + to_string(from) + "->" + to_string(to), std::move(fn));
    };
    e.dtypes = "float16, bfloat16, the float8 types, float4e2m1, float32, float64, int2..int64, uint2..uint64, bool";
    registry.add(std::move(e));
  }
  {
    // BitCast: the same bytes as another type of the same width, so both sides keep their
    // logical dtype (no float16 storage) and the layer is a copy.
    LayerEntry e;
    e.op = "BitCast";
    e.check = [](const LayerRequest& r) -> std::string {
      if (!r.has_input(0)) return "input is missing";
      const DType from = r.input_dtypes[0], to = r.output_dtypes.at(0);
      if (element_size(from) == 0 || element_size(from) != element_size(to))
        return "cannot bitcast " + to_string(from) + " to " + to_string(to) + " (types of one width only)";
      return "";
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs.resize(r.inputs.size());
      f.inputs[0] = Format{r.input_dtypes[0], Layout::kLinear};
      f.outputs.push_back(Format{r.output_dtypes[0], Layout::kLinear});
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats&, BuildServices&) -> std::unique_ptr<Layer> {
      const size_t bytes = static_cast<size_t>(shape_numel(r.output_shapes[0])) * element_size(r.output_dtypes[0]);
      return make_layer("kernel:bitcast copy", [bytes](const LayerIO& io, cudaStream_t stream) {
        if (bytes) KILN_CUDA_CHECK(cudaMemcpyAsync(io.outputs[0], io.inputs[0], bytes, cudaMemcpyDeviceToDevice, stream));
      });
    };
    e.dtypes = "all of one width";
    registry.add(std::move(e));
  }
  {
    // Dropout in inference: Y is X (copied in its storage and layout), the mask all true.
    LayerEntry e;
    e.op = "Dropout";
    e.check = [](const LayerRequest& r) -> std::string {
      if (!r.has_input(0)) return "input is missing";
      if (r.has_input(2)) {
        if (!r.is_constant(2)) return "training_mode must be a constant";
        if (r.constants[2]->numel() == 1 && r.constants[2]->value_as_int(0) != 0)
          return "training_mode is true; kiln runs inference only";
      }
      return "";
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs.resize(r.inputs.size());
      Format in{r.storage_of(r.input_dtypes[0]), Layout::kLinear};
      if (!r.is_constant(0)) in = r.inputs[0]->format;
      f.inputs[0] = in;
      // ratio and training_mode are not read on the device (a runtime ratio is unused in inference).
      for (size_t i = 1; i < r.inputs.size(); ++i)
        if (r.has_input(i) && !r.is_constant(i)) f.inputs[i] = r.inputs[i]->format;
      f.outputs.push_back(in);
      if (r.output_shapes.size() > 1) f.outputs.push_back(Format{DType::kBool, Layout::kLinear});
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) -> std::unique_ptr<Layer> {
      const size_t bytes = static_cast<size_t>(shape_numel(r.output_shapes[0])) * element_size(f.outputs[0].dtype);
      const size_t mask_bytes =
          r.output_shapes.size() > 1 && r.output_dtypes[1] != DType::kUndefined ? static_cast<size_t>(shape_numel(r.output_shapes[1])) : 0;
      return make_layer("kernel:dropout copy", [bytes, mask_bytes](const LayerIO& io, cudaStream_t stream) {
        if (bytes) KILN_CUDA_CHECK(cudaMemcpyAsync(io.outputs[0], io.inputs[0], bytes, cudaMemcpyDeviceToDevice, stream));
        if (mask_bytes && io.outputs.size() > 1 && io.outputs[1])
          KILN_CUDA_CHECK(cudaMemsetAsync(io.outputs[1], 1, mask_bytes, stream));
      });
    };
    e.dtypes = "all (inference: a copy)";
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cuda
