// CUDA layers of broadcasting elementwise ops (the ops of src/cpu/binary.cc, and Clip of
// src/cpu/cast.cc): Add Sub Mul Div Mod Pow PRelu, variadic Max Min Sum Mean, comparisons,
// And Or Xor, BitShift, BitwiseAnd BitwiseOr BitwiseXor, Where, Clip, SwiGLU.
//
// Layouts: inputs are read in whatever layout they are stored (no reformat); each operand is
// walked through its logical strides, permuted into the output's physical order. The output
// is kNHWC when some rank-4 runtime input with the output's shape is stored kNHWC. Constant
// operands (biases, scalars) are uploaded by the builder (kLinear).
//
// Kernels: after dropping size-1 dims and merging dims that every operand walks contiguously,
// a pass is either "flat" (every operand contiguous or a scalar: same-shape residual adds,
// tensor-scalar ops; vectorized 16-byte accesses) or "strided" (each thread takes a group of
// consecutive elements along the innermost merged dim, computes the operands' offsets once per
// group with 32-bit magic-number division when the output has fewer than 2^31 elements, and
// moves operands contiguous or broadcast along that dim as vectors). On an H100 both run at
// 2.65-3.0 TB/s for [32,256,56,56] float32/float16 (same-shape add, per-channel bias add in
// NCHW and NHWC, SE-style [N,C,1,1] multiply in NHWC fp16); mixing an NHWC and an NCHW
// operand of the same shape (a transposing read) ran at 2.55 TB/s.
//
// Semantics follow the CPU kernels: integer arithmetic wraps; integer Div truncates toward
// zero, x / -1 wraps; Mod with fmod=0 takes the divisor's sign; Max/Min propagate NaN; integer
// Pow goes through double and saturates; BitShift by >= the bit width gives 0; Mean divides
// the sum once at the end. float16/bfloat16 storage computes in float32. One difference: an
// integer Div/Mod by zero in a RUNTIME divisor gives 0 here (the CPU engine throws; a GPU
// kernel cannot); a constant divisor with a zero fails the build, as the CPU run would fail.
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

// ---- storage <-> compute ---------------------------------------------------------------

template <class T, int V> struct alignas(sizeof(T) * V) Pack { T v[V]; };

template <size_t kBytes> __device__ __forceinline__ bool aligned_to(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kBytes == 0;
}

// ---- integer helpers -------------------------------------------------------------------

// Two's-complement wrap-around arithmetic (what the CPU's static_cast<T>(a op b) gives).
template <class X> using wide_unsigned_t = std::conditional_t<(sizeof(X) > 4), uint64_t, uint32_t>;

template <class X> __device__ __forceinline__ X add_wrap(X a, X b) {
  if constexpr (std::is_integral_v<X>) return static_cast<X>(static_cast<wide_unsigned_t<X>>(a) + static_cast<wide_unsigned_t<X>>(b));
  else return a + b;
}
template <class X> __device__ __forceinline__ X sub_wrap(X a, X b) {
  if constexpr (std::is_integral_v<X>) return static_cast<X>(static_cast<wide_unsigned_t<X>>(a) - static_cast<wide_unsigned_t<X>>(b));
  else return a - b;
}
template <class X> __device__ __forceinline__ X mul_wrap(X a, X b) {
  if constexpr (std::is_integral_v<X>) return static_cast<X>(static_cast<wide_unsigned_t<X>>(a) * static_cast<wide_unsigned_t<X>>(b));
  else return a * b;
}

// double -> integer: NaN gives 0, out-of-range values saturate (as the CPU's saturate_to).
template <class X> __device__ __forceinline__ X saturate_to(double v) {
  if (isnan(v)) return X(0);
  if (v <= static_cast<double>(std::numeric_limits<X>::lowest())) return std::numeric_limits<X>::lowest();
  if (v >= static_cast<double>(std::numeric_limits<X>::max())) return std::numeric_limits<X>::max();
  return static_cast<X>(v);
}

// ---- functors (arguments in compute type) ------------------------------------------------

struct AddOp { template <class X> __device__ X operator()(X a, X b) const { return add_wrap(a, b); } };
struct SubOp { template <class X> __device__ X operator()(X a, X b) const { return sub_wrap(a, b); } };
struct MulOp { template <class X> __device__ X operator()(X a, X b) const { return mul_wrap(a, b); } };

struct DivOp {
  template <class X> __device__ X operator()(X a, X b) const {
    if constexpr (std::is_integral_v<X>) {
      if (b == 0) return X(0);  // the CPU throws; see the file comment
      if constexpr (std::is_signed_v<X>)
        if (b == X(-1)) return sub_wrap(X(0), a);
    }
    return static_cast<X>(a / b);
  }
};

struct ModOp {
  bool c_style;  // fmod=1
  template <class X> __device__ X operator()(X a, X b) const {
    X r;
    if constexpr (std::is_integral_v<X>) {
      if (b == 0) return X(0);
      if constexpr (std::is_signed_v<X>)
        if (b == X(-1)) return X(0);
      r = static_cast<X>(a % b);
    } else if constexpr (std::is_same_v<X, float>) {
      r = fmodf(a, b);
    } else {
      r = fmod(a, b);
    }
    if constexpr (std::is_signed_v<X>)
      if (!c_style && r != X(0) && ((r < X(0)) != (b < X(0)))) r = add_wrap(r, b);
    return r;
  }
};

struct PReluOp {
  template <class X> __device__ X operator()(X x, X slope) const {
    if constexpr (std::is_unsigned_v<X>) return x;
    else return x < X(0) ? mul_wrap(x, slope) : x;
  }
};
struct MaxOp {
  template <class X> __device__ X operator()(X a, X b) const { return a >= b || a != a ? a : b; }
};
struct MinOp {
  template <class X> __device__ X operator()(X a, X b) const { return a <= b || a != a ? a : b; }
};
// The last fold of Mean: the running sum plus one input, divided by the input count.
struct MeanOp {
  int64_t count;
  template <class X> __device__ X operator()(X a, X b) const { return static_cast<X>(add_wrap(a, b) / static_cast<X>(count)); }
};

// Integer base, integral exponent: the CPU's saturate_to<X>(std::pow(double(a), double(b)))
// computed exactly (CUDA's double pow is not correctly rounded: 8^7 came out 2097151.99...,
// which truncates to 2097151). The exact power is rounded to double once, as a correctly
// rounded pow does, then saturated.
template <class X> __device__ X int_pow(X a, double b) {
  const bool odd = fmod(b, 2.0) != 0.0;
  if (b < 0) {
    if (a == 0) return std::numeric_limits<X>::max();  // pow(+0, -n) = +inf
    if (a == 1) return X(1);
    if constexpr (std::is_signed_v<X>)
      if (a == X(-1)) return odd ? X(-1) : X(1);
    return X(0);  // |a^b| < 1 truncates to 0
  }
  if (b == 0) return X(1);
  if (a == 0 || a == 1) return a;
  const bool negative = std::is_signed_v<X> && a < X(0) && odd;
  uint64_t base = static_cast<uint64_t>(a);
  if constexpr (std::is_signed_v<X>)
    if (a < X(0)) base = uint64_t{0} - static_cast<uint64_t>(static_cast<int64_t>(a));
  if (base == 1) return negative ? X(-1) : X(1);
  bool overflow = b > 64;  // |a| >= 2
  uint64_t mag = 1;
  for (int64_t e = 0; !overflow && e < static_cast<int64_t>(b); ++e) {
    if (__umul64hi(mag, base) != 0) overflow = true;
    mag *= base;
  }
  if (overflow) return negative ? std::numeric_limits<X>::lowest() : std::numeric_limits<X>::max();
  const double d = __ull2double_rn(mag);
  return saturate_to<X>(negative ? -d : d);
}

struct PowOp {
  template <class X, class Y> __device__ X operator()(X a, Y b) const {
    if constexpr (std::is_same_v<X, float>) {
      return powf(a, static_cast<float>(b));
    } else if constexpr (std::is_same_v<X, double>) {
      return pow(a, static_cast<double>(b));
    } else {
      const double e = static_cast<double>(b);
      if (e == trunc(e)) return int_pow<X>(a, e);
      return saturate_to<X>(pow(static_cast<double>(a), e));
    }
  }
};

enum class Cmp : int { kEqual, kLess, kLessOrEqual, kGreater, kGreaterOrEqual };
template <Cmp kCmp> struct CmpOp {
  template <class X> __device__ uint8_t operator()(X a, X b) const {
    if constexpr (kCmp == Cmp::kEqual) return a == b;
    else if constexpr (kCmp == Cmp::kLess) return a < b;
    else if constexpr (kCmp == Cmp::kLessOrEqual) return a <= b;
    else if constexpr (kCmp == Cmp::kGreater) return a > b;
    else return a >= b;
  }
};

struct AndOp { __device__ uint8_t operator()(uint8_t a, uint8_t b) const { return a && b; } };
struct OrOp { __device__ uint8_t operator()(uint8_t a, uint8_t b) const { return a || b; } };
struct XorOp { __device__ uint8_t operator()(uint8_t a, uint8_t b) const { return !a != !b; } };

// As the CPU kernel (ONNX's reference): a shift by less than 0 or by the bit width or more gives
// 0 (a right shift of a negative value: -1); a left shift wraps in the unsigned type's bits; a
// right shift of a signed value is arithmetic.
template <bool kLeft> struct ShiftOp {
  template <class X> __device__ X operator()(X a, X s) const {
    using U = std::make_unsigned_t<X>;
    constexpr int64_t kBits = static_cast<int64_t>(sizeof(X) * 8);
    const bool out_of_range = static_cast<int64_t>(s) < 0 || static_cast<int64_t>(s) >= kBits;
    if (kLeft) return out_of_range ? X(0) : static_cast<X>(static_cast<U>(static_cast<U>(a) << static_cast<int>(s)));
    if (out_of_range) return a < X(0) ? static_cast<X>(-1) : X(0);
    return static_cast<X>(a >> static_cast<int>(s));
  }
};

enum class Bitwise : int { kAnd, kOr, kXor };
template <Bitwise kOp> struct BitwiseOp {
  template <class X> __device__ X operator()(X a, X b) const {
    if constexpr (kOp == Bitwise::kAnd) return static_cast<X>(a & b);
    else if constexpr (kOp == Bitwise::kOr) return static_cast<X>(a | b);
    else return static_cast<X>(a ^ b);
  }
};

struct WhereOp {
  template <class X> __device__ X operator()(uint8_t c, X x, X y) const { return c ? x : y; }
};

// Clip with scalar bounds: constants (and omitted bounds) as values, runtime bounds read
// from the device.
template <class T> struct ClipOp {
  using X = compute_t<T>;
  X lo, hi;
  const T* lo_ptr = nullptr;
  const T* hi_ptr = nullptr;
  __device__ X operator()(X x) const {
    const X l = lo_ptr ? to_compute(*lo_ptr) : lo;
    const X h = hi_ptr ? to_compute(*hi_ptr) : hi;
    const X v = x < l ? l : x;  // min > max yields max, as the CPU (and ONNX Runtime)
    return v > h ? h : v;
  }
};

template <int N, class Op, class A, class B, class C>
__device__ __forceinline__ auto apply(const Op& op, A a, B b, C c) {
  if constexpr (N == 1) return op(to_compute(a));
  else if constexpr (N == 2) return op(to_compute(a), to_compute(b));
  else return op(to_compute(a), to_compute(b), to_compute(c));
}

// ---- index walk ----------------------------------------------------------------------------

template <int N>
struct Walk {
  int rank = 1;
  bool narrow = true;  // fewer than 2^31 elements: 32-bit index math
  int64_t dims[kMaxKernelRank] = {};
  FastDiv div[kMaxKernelRank] = {};
  int64_t strides[N][kMaxKernelRank] = {};
};

// Element offsets of every operand for output element i (physical order).
template <int N>
__device__ __forceinline__ void walk_offsets(const Walk<N>& w, int64_t i, int64_t (&off)[N]) {
  if (w.narrow) {
    uint32_t rem = static_cast<uint32_t>(i);
    uint32_t o[N];
#pragma unroll
    for (int k = 0; k < N; ++k) o[k] = 0;
#pragma unroll
    for (int d = kMaxKernelRank - 1; d >= 1; --d) {
      if (d >= w.rank) continue;
      const uint32_t q = fast_div(w.div[d], rem);
      const uint32_t idx = rem - q * static_cast<uint32_t>(w.dims[d]);
      rem = q;
#pragma unroll
      for (int k = 0; k < N; ++k) o[k] += idx * static_cast<uint32_t>(w.strides[k][d]);
    }
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = o[k] + rem * static_cast<uint32_t>(w.strides[k][0]);
  } else {
    int64_t rem = i;
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
#pragma unroll
    for (int d = kMaxKernelRank - 1; d >= 1; --d) {
      if (d >= w.rank) continue;
      const int64_t q = rem / w.dims[d];
      const int64_t idx = rem - q * w.dims[d];
      rem = q;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += idx * w.strides[k][d];
    }
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += rem * w.strides[k][0];
  }
}

// ---- kernels -------------------------------------------------------------------------------

template <class U, class A, class B, class C> constexpr int flat_vec_width() {
  size_t widest = sizeof(U);
  if (sizeof(A) > widest) widest = sizeof(A);
  if (sizeof(B) > widest) widest = sizeof(B);
  if (sizeof(C) > widest) widest = sizeof(C);
  const int v = static_cast<int>(16 / widest);
  return v > 8 ? 8 : (v < 1 ? 1 : v);
}

template <class T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p, int64_t v, bool scalar, T s) {
  Pack<T, V> out;
  if (scalar) {
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = s;
  } else {
    out = reinterpret_cast<const Pack<T, V>*>(p)[v];
  }
  return out;
}

// Every operand contiguous in the output's order, or a scalar (bit k of scalar_mask).
// Unused operands (N < 3) have type uint8_t and a null pointer.
template <int N, class U, class A, class B, class C, class Op>
__global__ void flat_kernel(Op op, U* __restrict__ y, const A* __restrict__ a, const B* __restrict__ b,
                            const C* __restrict__ c, int64_t n, unsigned scalar_mask) {
  constexpr int V = flat_vec_width<U, A, B, C>();
  const bool sa = scalar_mask & 1u, sb = scalar_mask & 2u, sc = scalar_mask & 4u;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t tid = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const A a0 = sa ? a[0] : A();
  B b0 = B();
  C c0 = C();
  if constexpr (N >= 2) b0 = sb ? b[0] : B();
  if constexpr (N >= 3) c0 = sc ? c[0] : C();
  bool vec = aligned_to<sizeof(U) * V>(y) && (sa || aligned_to<sizeof(A) * V>(a));
  if constexpr (N >= 2) vec = vec && (sb || aligned_to<sizeof(B) * V>(b));
  if constexpr (N >= 3) vec = vec && (sc || aligned_to<sizeof(C) * V>(c));
  const int64_t nv = vec ? n / V : 0;
  for (int64_t v = tid; v < nv; v += stride) {
    const Pack<A, V> pa = load_pack<A, V>(a, v, sa, a0);
    Pack<B, V> pb{};
    Pack<C, V> pc{};
    if constexpr (N >= 2) pb = load_pack<B, V>(b, v, sb, b0);
    if constexpr (N >= 3) pc = load_pack<C, V>(c, v, sc, c0);
    Pack<U, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_compute<U>(apply<N>(op, pa.v[j], pb.v[j], pc.v[j]));
    reinterpret_cast<Pack<U, V>*>(y)[v] = out;
  }
  for (int64_t i = nv * V + tid; i < n; i += stride) {
    const A av = sa ? a0 : a[i];
    B bv = B();
    C cv = C();
    if constexpr (N >= 2) bv = sb ? b0 : b[i];
    if constexpr (N >= 3) cv = sc ? c0 : c[i];
    y[i] = from_compute<U>(apply<N>(op, av, bv, cv));
  }
}

// V elements of one operand starting at element offset `off`, `s` apart (0: broadcast);
// one vector access when contiguous and aligned, else element by element (`cnt` valid ones,
// the rest repeat the first).
template <class T, int V>
__device__ __forceinline__ Pack<T, V> load_group(const T* p, int64_t off, int64_t s, int cnt) {
  Pack<T, V> out;
  if (s == 0) {
    const T v = p[off];
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = v;
  } else if (s == 1 && cnt == V && aligned_to<sizeof(T) * V>(p + off)) {
    out = *reinterpret_cast<const Pack<T, V>*>(p + off);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = p[off + (j < cnt ? j : 0) * s];
  }
  return out;
}

// The general broadcast: each thread takes a group of V consecutive output elements of one
// row (the innermost merged dim, `row` elements long, `per_row` groups), so the index walk is
// paid once per group and operands that are contiguous (or broadcast) along the row move as
// vectors.
template <int N, class U, class A, class B, class C, class Op>
__global__ void strided_kernel(Op op, U* __restrict__ y, const A* __restrict__ a, const B* __restrict__ b,
                               const C* __restrict__ c, Walk<N> w, int64_t groups, int64_t row, int64_t per_row,
                               FastDiv per_row_div) {
  constexpr int V = flat_vec_width<U, A, B, C>();
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int inner = w.rank - 1;
  for (int64_t g = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const int64_t r = w.narrow ? fast_div(per_row_div, static_cast<uint32_t>(g)) : g / per_row;
    const int64_t col = (g - r * per_row) * V;
    const int64_t i = r * row + col;
    const int cnt = row - col < V ? static_cast<int>(row - col) : V;
    int64_t off[N];
    walk_offsets<N>(w, i, off);
    const Pack<A, V> pa = load_group<A, V>(a, off[0], w.strides[0][inner], cnt);
    Pack<B, V> pb{};
    Pack<C, V> pc{};
    if constexpr (N >= 2) pb = load_group<B, V>(b, off[1], w.strides[1][inner], cnt);
    if constexpr (N >= 3) pc = load_group<C, V>(c, off[2], w.strides[2][inner], cnt);
    Pack<U, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_compute<U>(apply<N>(op, pa.v[j], pb.v[j], pc.v[j]));
    if (cnt == V && aligned_to<sizeof(U) * V>(y + i)) {
      *reinterpret_cast<Pack<U, V>*>(y + i) = out;
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (j < cnt) y[i + j] = out.v[j];
    }
  }
}

// ---- host planning -------------------------------------------------------------------------

// One kernel launch over the output: flat or strided.
template <int N>
struct Pass {
  int64_t n = 0;
  bool flat = false;
  unsigned scalar_mask = 0;
  Walk<N> walk;
  std::string kind() const { return flat ? (scalar_mask ? "flat+scalar" : "flat") : "strided"; }
};

struct MergedWalk {
  std::vector<int64_t> dims;                  // iteration order, outermost first
  std::vector<std::vector<int64_t>> strides;  // per operand
};

// The output walked in its physical order; each operand through its logical strides, right-
// aligned to the output's rank, broadcast dims at stride 0; size-1 dims dropped and dims that
// every operand walks contiguously merged.
MergedWalk merge_walk(const std::vector<int64_t>& out_shape, Layout out_layout, const std::vector<TensorSpec>& ops) {
  const size_t rank = out_shape.size();
  std::vector<size_t> perm(rank);
  for (size_t d = 0; d < rank; ++d) perm[d] = d;
  if (out_layout == Layout::kNHWC && rank == 4) perm = {0, 2, 3, 1};
  std::vector<std::vector<int64_t>> logical(ops.size(), std::vector<int64_t>(rank, 0));
  for (size_t k = 0; k < ops.size(); ++k) {
    const TensorSpec& s = ops[k];
    if (s.shape.size() > rank) throw Error(ErrorKind::kInternal, "operand rank exceeds the output's");
    const std::vector<int64_t> ls = s.logical_strides();
    const size_t lead = rank - s.shape.size();
    for (size_t j = 0; j < s.shape.size(); ++j) {
      const int64_t dim = s.shape[j];
      if (dim != 1 && dim != out_shape[lead + j])
        throw Error(ErrorKind::kInternal, "operand shape " + shape_to_string(s.shape) + " does not broadcast to " +
                                              shape_to_string(out_shape));
      logical[k][lead + j] = dim == 1 ? 0 : ls[j];
    }
  }
  MergedWalk m;
  m.strides.resize(ops.size());
  for (size_t p = 0; p < rank; ++p) {
    const size_t d = perm[p];
    if (out_shape[d] == 1) continue;
    bool merge = !m.dims.empty();
    for (size_t k = 0; k < ops.size() && merge; ++k)
      merge = m.strides[k].back() == logical[k][d] * out_shape[d];
    if (merge) {
      m.dims.back() *= out_shape[d];
      for (size_t k = 0; k < ops.size(); ++k) m.strides[k].back() = logical[k][d];
    } else {
      m.dims.push_back(out_shape[d]);
      for (size_t k = 0; k < ops.size(); ++k) m.strides[k].push_back(logical[k][d]);
    }
  }
  if (m.dims.empty()) {  // a scalar, or every dim is 1
    m.dims.push_back(1);
    for (auto& s : m.strides) s.push_back(0);
  }
  return m;
}

int merged_rank(const std::vector<int64_t>& out_shape, Layout out_layout, const std::vector<TensorSpec>& ops) {
  return static_cast<int>(merge_walk(out_shape, out_layout, ops).dims.size());
}

template <int N>
Pass<N> make_pass(const std::vector<int64_t>& out_shape, Layout out_layout, const std::vector<TensorSpec>& ops) {
  if (ops.size() != N) throw Error(ErrorKind::kInternal, "operand count mismatch");
  Pass<N> pass;
  pass.n = shape_numel(out_shape);
  const MergedWalk m = merge_walk(out_shape, out_layout, ops);
  const int rank = static_cast<int>(m.dims.size());
  if (rank == 1) {
    pass.flat = true;
    for (int k = 0; k < N; ++k) {
      const int64_t s = m.strides[static_cast<size_t>(k)][0];
      if (s == 0) pass.scalar_mask |= 1u << k;
      else if (s != 1) pass.flat = false;
    }
  }
  if (rank > kMaxKernelRank)
    throw Error(ErrorKind::kUnsupported, "broadcast of rank " + std::to_string(rank) + " after merging dims (at most " +
                                             std::to_string(kMaxKernelRank) + ")");
  Walk<N>& w = pass.walk;
  w.rank = rank;
  w.narrow = pass.n < (int64_t{1} << 31);
  for (int d = 0; d < rank; ++d) {
    w.dims[d] = m.dims[static_cast<size_t>(d)];
    if (w.narrow && w.dims[d] > 0) w.div[d] = make_fast_div(static_cast<uint32_t>(w.dims[d]));
    for (int k = 0; k < N; ++k) w.strides[k][d] = m.strides[static_cast<size_t>(k)][static_cast<size_t>(d)];
  }
  return pass;
}

template <int N, class U, class A, class B = uint8_t, class C = uint8_t, class Op>
void run_pass(const Op& op, const Pass<N>& pass, void* y, const void* a, const void* b, const void* c,
              cudaStream_t stream) {
  if (pass.n <= 0) return;
  U* py = static_cast<U*>(y);
  const A* pa = static_cast<const A*>(a);
  const B* pb = static_cast<const B*>(b);
  const C* pc = static_cast<const C*>(c);
  if (pass.flat) {
    constexpr int V = flat_vec_width<U, A, B, C>();
    flat_kernel<N, U, A, B, C, Op><<<grid_for(pass.n, 256, V), 256, 0, stream>>>(op, py, pa, pb, pc, pass.n,
                                                                                 pass.scalar_mask);
  } else {
    constexpr int V = flat_vec_width<U, A, B, C>();
    const int64_t row = pass.walk.dims[pass.walk.rank - 1];
    const int64_t per_row = (row + V - 1) / V;
    const int64_t groups = pass.n / row * per_row;
    const FastDiv per_row_div = pass.walk.narrow ? make_fast_div(static_cast<uint32_t>(per_row)) : FastDiv{};
    strided_kernel<N, U, A, B, C, Op><<<grid_for(groups, 256, 2), 256, 0, stream>>>(
        op, py, pa, pb, pc, pass.walk, groups, row, per_row, per_row_div);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

// ---- dtype dispatch -----------------------------------------------------------------------

// Storage types of numeric dtypes (float32/float16/bfloat16/float64 and all integers).
template <class Fn>
bool dispatch_numeric(DType d, Fn&& fn) {
  switch (d) {
    case DType::kFloat32: fn(float{}); return true;
    case DType::kFloat16: fn(__half{}); return true;
    case DType::kBFloat16: fn(__nv_bfloat16{}); return true;
    case DType::kFloat64: fn(double{}); return true;
    case DType::kInt8: fn(int8_t{}); return true;
    case DType::kInt16: fn(int16_t{}); return true;
    case DType::kInt32: fn(int32_t{}); return true;
    case DType::kInt64: fn(int64_t{}); return true;
    case DType::kUInt8: fn(uint8_t{}); return true;
    case DType::kUInt16: fn(uint16_t{}); return true;
    case DType::kUInt32: fn(uint32_t{}); return true;
    case DType::kUInt64: fn(uint64_t{}); return true;
    default: return false;
  }
}

template <class Fn>
bool dispatch_pow_base(DType d, Fn&& fn) {
  switch (d) {
    case DType::kFloat32: fn(float{}); return true;
    case DType::kFloat16: fn(__half{}); return true;
    case DType::kBFloat16: fn(__nv_bfloat16{}); return true;
    case DType::kFloat64: fn(double{}); return true;
    case DType::kInt32: fn(int32_t{}); return true;
    case DType::kInt64: fn(int64_t{}); return true;
    default: return false;
  }
}

template <class Fn>
bool dispatch_integer(DType d, Fn&& fn) {
  switch (d) {
    case DType::kInt8: fn(int8_t{}); return true;
    case DType::kInt16: fn(int16_t{}); return true;
    case DType::kInt32: fn(int32_t{}); return true;
    case DType::kInt64: fn(int64_t{}); return true;
    case DType::kUInt8: fn(uint8_t{}); return true;
    case DType::kUInt16: fn(uint16_t{}); return true;
    case DType::kUInt32: fn(uint32_t{}); return true;
    case DType::kUInt64: fn(uint64_t{}); return true;
    default: return false;
  }
}

// Raw bits of an element size (Where only moves elements).
template <class Fn>
bool dispatch_bits(size_t size, Fn&& fn) {
  switch (size) {
    case 1: fn(uint8_t{}); return true;
    case 2: fn(uint16_t{}); return true;
    case 4: fn(uint32_t{}); return true;
    case 8: fn(uint64_t{}); return true;
    default: return false;
  }
}

bool is_numeric(DType d) { return dispatch_numeric(d, [](auto) {}); }

const char* const kNumericList = "float32, float16, bfloat16, float64, int8..int64, uint8..uint64";

// ---- formats and operand specs -------------------------------------------------------------

// kNHWC iff some rank-4 runtime input with the output's shape is stored kNHWC.
Layout output_layout(const LayerRequest& r, size_t first, size_t last) {
  const std::vector<int64_t>& out = r.output_shapes.at(0);
  if (out.size() != 4) return Layout::kLinear;
  for (size_t i = first; i < last && i < r.inputs.size(); ++i)
    if (r.has_input(i) && !r.is_constant(i) && r.inputs[i]->shape == out && r.inputs[i]->format.layout == Layout::kNHWC)
      return Layout::kNHWC;
  return Layout::kLinear;
}

// Every input (runtime in its current layout, constants uploaded kLinear) at the storage of
// its logical dtype; the output at the storage of its dtype, in output_layout().
LayerFormats broadcast_formats(const LayerRequest& r) {
  LayerFormats f;
  f.inputs.resize(r.inputs.size());
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    if (!r.has_input(i)) continue;
    Layout l = Layout::kLinear;
    if (!r.is_constant(i) && r.inputs[i]->rank() == 4) l = r.inputs[i]->format.layout;
    f.inputs[i] = Format{r.storage_of(r.input_dtypes[i]), l};
  }
  f.outputs.push_back(Format{r.storage_of(r.output_dtypes.at(0)), output_layout(r, 0, r.inputs.size())});
  return f;
}

// The spec an input arrives with in create(): runtime inputs as the builder delivers them,
// uploaded constants in the format asked for.
TensorSpec operand_spec(const LayerRequest& r, const LayerFormats& f, size_t i) {
  if (r.is_constant(i)) return TensorSpec{r.input_shape(i), f.inputs[i]};
  return *r.inputs[i];
}

// The merged rank of the broadcast as formats() would lay it out (for check()).
std::string check_broadcast_rank(const LayerRequest& r) {
  LayerFormats f = broadcast_formats(r);
  std::vector<TensorSpec> ops;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    if (!r.has_input(i)) continue;
    TensorSpec s{r.input_shape(i), f.inputs[i]};
    ops.push_back(s);
  }
  try {
    // Variadic ops run pairwise; each pass has at most the rank of all operands together.
    int rank = merged_rank(r.output_shapes.at(0), f.outputs[0].layout, ops);
    if (rank > kMaxKernelRank)
      return "broadcast over " + std::to_string(rank) + " non-mergeable dims is not supported (at most " +
             std::to_string(kMaxKernelRank) + ")";
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

std::string dtype_reason(const char* what, DType d, const char* supported) {
  return std::string(what) + " type " + to_string(d) + " is not supported (supported: " + supported + ")";
}

// A constant integer divisor containing 0 fails here, as the CPU run would.
template <class T>
void check_constant_divisor(const LayerRequest& r) {
  if constexpr (std::is_integral_v<T>) {
    if (!r.is_constant(1)) return;
    const Tensor& d = *r.constants[1];
    const T* p = static_cast<const T*>(d.raw());
    for (int64_t i = 0; i < d.numel(); ++i)
      if (p[i] == 0)
        throw r.node.error(ErrorKind::kInvalidArgument, "integer " + r.node.op + " by zero (element " +
                                                            std::to_string(i) + " of the divisor)");
  }
}

// ---- layers --------------------------------------------------------------------------------

// A 2-input op over inputs 0 and 1: out = op(in0, in1).
template <class U, class A, class B, class Op>
std::unique_ptr<Layer> binary_layer(const LayerRequest& r, const LayerFormats& f, const Op& op, const std::string& name) {
  const Pass<2> pass = make_pass<2>(r.output_shapes[0], f.outputs[0].layout, {operand_spec(r, f, 0), operand_spec(r, f, 1)});
  std::string tactic = "kernel:" + name + " " + pass.kind();
  return make_layer(std::move(tactic), [op, pass](const LayerIO& io, cudaStream_t stream) {
    run_pass<2, U, A, B>(op, pass, io.outputs[0], io.inputs[0], io.inputs[1], nullptr, stream);
  });
}

template <class T>
std::unique_ptr<Layer> arithmetic_layer(const LayerRequest& r, const LayerFormats& f) {
  const std::string& op = r.node.op;
  if (op == "Add") return binary_layer<T, T, T>(r, f, AddOp{}, "add");
  if (op == "Sub") return binary_layer<T, T, T>(r, f, SubOp{}, "sub");
  if (op == "Mul") return binary_layer<T, T, T>(r, f, MulOp{}, "mul");
  if (op == "Div") {
    check_constant_divisor<T>(r);
    return binary_layer<T, T, T>(r, f, DivOp{}, "div");
  }
  if (op == "Mod") {
    check_constant_divisor<T>(r);
    return binary_layer<T, T, T>(r, f, ModOp{r.node.attrs.get_int("fmod", 0) != 0}, "mod");
  }
  if (op == "PRelu") return binary_layer<T, T, T>(r, f, PReluOp{}, "prelu");
  throw r.node.error(ErrorKind::kInternal, "no CUDA arithmetic kernel for " + op);
}

// Max / Min / Sum / Mean over any number of inputs: folded pairwise into the output (which
// has the broadcast shape of them all), in input order as the CPU does; Mean divides in the
// last fold. One input is a copy.
template <class T>
std::unique_ptr<Layer> variadic_layer(const LayerRequest& r, const LayerFormats& f) {
  const std::string op = r.node.op;
  const size_t count = r.inputs.size();
  const std::vector<int64_t>& out_shape = r.output_shapes[0];
  const TensorSpec out_spec{out_shape, f.outputs[0]};
  if (count == 1) {
    const size_t bytes = out_spec.bytes();
    return make_layer("kernel:" + op + " copy", [bytes](const LayerIO& io, cudaStream_t stream) {
      if (bytes) KILN_CUDA_CHECK(cudaMemcpyAsync(io.outputs[0], io.inputs[0], bytes, cudaMemcpyDeviceToDevice, stream));
    });
  }
  std::vector<Pass<2>> passes;
  passes.push_back(make_pass<2>(out_shape, f.outputs[0].layout, {operand_spec(r, f, 0), operand_spec(r, f, 1)}));
  for (size_t i = 2; i < count; ++i)
    passes.push_back(make_pass<2>(out_shape, f.outputs[0].layout, {out_spec, operand_spec(r, f, i)}));
  std::string tactic = "kernel:" + op;
  for (const auto& p : passes) {
    tactic += ' ';
    tactic += p.kind();
  }
  const int64_t n_inputs = static_cast<int64_t>(count);
  return make_layer(std::move(tactic), [op, passes, n_inputs](const LayerIO& io, cudaStream_t stream) {
    for (size_t p = 0; p < passes.size(); ++p) {
      const void* acc = p == 0 ? io.inputs[0] : io.outputs[0];
      const void* x = io.inputs[p + 1];
      const bool last = p + 1 == passes.size();
      if (op == "Max") run_pass<2, T, T, T>(MaxOp{}, passes[p], io.outputs[0], acc, x, nullptr, stream);
      else if (op == "Min") run_pass<2, T, T, T>(MinOp{}, passes[p], io.outputs[0], acc, x, nullptr, stream);
      else if (op == "Mean" && last) run_pass<2, T, T, T>(MeanOp{n_inputs}, passes[p], io.outputs[0], acc, x, nullptr, stream);
      else run_pass<2, T, T, T>(AddOp{}, passes[p], io.outputs[0], acc, x, nullptr, stream);
    }
  });
}

template <class T>
std::unique_ptr<Layer> comparison_layer(const LayerRequest& r, const LayerFormats& f) {
  const std::string& op = r.node.op;
  if (op == "Equal") return binary_layer<uint8_t, T, T>(r, f, CmpOp<Cmp::kEqual>{}, "equal");
  if (op == "Less") return binary_layer<uint8_t, T, T>(r, f, CmpOp<Cmp::kLess>{}, "less");
  if (op == "LessOrEqual") return binary_layer<uint8_t, T, T>(r, f, CmpOp<Cmp::kLessOrEqual>{}, "less_or_equal");
  if (op == "Greater") return binary_layer<uint8_t, T, T>(r, f, CmpOp<Cmp::kGreater>{}, "greater");
  return binary_layer<uint8_t, T, T>(r, f, CmpOp<Cmp::kGreaterOrEqual>{}, "greater_or_equal");
}

// A scalar constant (Clip's bound) in the compute type of storage T. The constant has X's
// logical dtype, so the conversion is exact.
template <class T>
compute_t<T> scalar_constant(const Tensor& t) {
  using X = compute_t<T>;
  if (t.numel() < 1) throw Error(ErrorKind::kInvalidArgument, "Clip bound is empty");
  switch (t.dtype()) {
    case DType::kFloat16: return static_cast<X>(half_to_float(static_cast<const uint16_t*>(t.raw())[0]));
    case DType::kBFloat16: return static_cast<X>(bfloat16_to_float(static_cast<const uint16_t*>(t.raw())[0]));
    case DType::kFloat32: return static_cast<X>(static_cast<const float*>(t.raw())[0]);
    case DType::kFloat64: return static_cast<X>(static_cast<const double*>(t.raw())[0]);
    default: break;
  }
  X v{};
  if constexpr (std::is_integral_v<X>) {
    if (element_size(t.dtype()) != sizeof(X)) throw Error(ErrorKind::kInternal, "Clip bound type mismatch");
    std::memcpy(&v, t.raw(), sizeof(X));
  } else {
    throw Error(ErrorKind::kInternal, "Clip bound type mismatch");
  }
  return v;
}

template <class T>
std::unique_ptr<Layer> clip_layer(const LayerRequest& r, const LayerFormats& f) {
  using X = compute_t<T>;
  ClipOp<T> op;
  op.lo = std::numeric_limits<X>::lowest();
  op.hi = std::numeric_limits<X>::max();
  bool lo_runtime = false, hi_runtime = false;
  if (r.has_input(1)) {
    if (r.is_constant(1)) op.lo = scalar_constant<T>(*r.constants[1]);
    else lo_runtime = true;
  }
  if (r.has_input(2)) {
    if (r.is_constant(2)) op.hi = scalar_constant<T>(*r.constants[2]);
    else hi_runtime = true;
  }
  Pass<1> pass;
  pass.n = shape_numel(r.output_shapes[0]);
  pass.flat = true;
  return make_layer("kernel:clip flat", [op, pass, lo_runtime, hi_runtime](const LayerIO& io, cudaStream_t stream) {
    ClipOp<T> run = op;
    if (lo_runtime) run.lo_ptr = static_cast<const T*>(io.inputs[1]);
    if (hi_runtime) run.hi_ptr = static_cast<const T*>(io.inputs[2]);
    run_pass<1, T, T>(run, pass, io.outputs[0], io.inputs[0], nullptr, nullptr, stream);
  });
}

std::string check_inputs_present(const LayerRequest& r, size_t required) {
  for (size_t i = 0; i < required; ++i)
    if (!r.has_input(i)) return "input " + std::to_string(i) + " is missing";
  return "";
}

// --- SwiGLU ---------------------------------------------------------------------------------

// A * sigmoid(alpha * A) * B over A and B of one shape, in float32 (float16 storage computes in
// float32), in the CPU kernel's order: a * (1 / (1 + exp(-alpha * a))) * b.
template <class T>
__global__ void swiglu_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, int64_t n, float alpha) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float av = load_float(a, i), bv = load_float(b, i);
    store_float(y, i, av * (1.f / (1.f + expf(-alpha * av))) * bv);
  }
}

std::unique_ptr<Layer> swiglu_layer(const LayerRequest& r, const LayerFormats& f) {
  const int64_t n = shape_numel(r.output_shapes[0]);
  const float alpha = r.node.attrs.get_float("alpha", 1.f);
  const bool half = f.inputs[0].dtype == DType::kFloat16;
  return make_layer("kernel:swiglu", [n, alpha, half](const LayerIO& io, cudaStream_t stream) {
    if (n == 0) return;
    if (half)
      swiglu_kernel<__half><<<grid_for(n), 256, 0, stream>>>(static_cast<const __half*>(io.inputs[0]),
                                                            static_cast<const __half*>(io.inputs[1]),
                                                            static_cast<__half*>(io.outputs[0]), n, alpha);
    else
      swiglu_kernel<float><<<grid_for(n), 256, 0, stream>>>(static_cast<const float*>(io.inputs[0]),
                                                           static_cast<const float*>(io.inputs[1]),
                                                           static_cast<float*>(io.outputs[0]), n, alpha);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(binary) {
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Mod", "PRelu"}) {
    LayerEntry e;
    e.op = op;
    e.check = [](const LayerRequest& r) -> std::string {
      if (auto why = check_inputs_present(r, 2); !why.empty()) return why;
      if (!is_numeric(r.input_dtypes[0])) return dtype_reason("input", r.input_dtypes[0], kNumericList);
      if (r.input_dtypes[1] != r.input_dtypes[0]) return "input types differ";
      return check_broadcast_rank(r);
    };
    e.formats = broadcast_formats;
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      std::unique_ptr<Layer> layer;
      dispatch_numeric(f.inputs[0].dtype, [&](auto tag) { layer = arithmetic_layer<decltype(tag)>(r, f); });
      if (!layer) throw r.node.error(ErrorKind::kInternal, "no CUDA kernel for " + to_string(f.inputs[0].dtype));
      return layer;
    };
    e.dtypes = "float32, float16, bfloat16, float64, int8..int64, uint8..uint64";
    registry.add(std::move(e));
  }
  for (const char* op : {"Max", "Min", "Sum", "Mean"}) {
    LayerEntry e;
    e.op = op;
    e.check = [](const LayerRequest& r) -> std::string {
      if (r.inputs.empty()) return "no inputs";
      if (auto why = check_inputs_present(r, r.inputs.size()); !why.empty()) return why;
      for (DType d : r.input_dtypes)
        if (d != r.input_dtypes[0]) return "input types differ";
      if (!is_numeric(r.input_dtypes[0])) return dtype_reason("input", r.input_dtypes[0], kNumericList);
      return check_broadcast_rank(r);
    };
    e.formats = broadcast_formats;
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      std::unique_ptr<Layer> layer;
      dispatch_numeric(f.inputs[0].dtype, [&](auto tag) { layer = variadic_layer<decltype(tag)>(r, f); });
      if (!layer) throw r.node.error(ErrorKind::kInternal, "no CUDA kernel for " + to_string(f.inputs[0].dtype));
      return layer;
    };
    e.dtypes = "float32, float16, bfloat16, float64, int8..int64, uint8..uint64";
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "Pow";
    e.check = [](const LayerRequest& r) -> std::string {
      if (auto why = check_inputs_present(r, 2); !why.empty()) return why;
      if (!dispatch_pow_base(r.input_dtypes[0], [](auto) {}))
        return dtype_reason("base", r.input_dtypes[0], "float32, float16, bfloat16, float64, int32, int64");
      if (!is_numeric(r.input_dtypes[1])) return dtype_reason("exponent", r.input_dtypes[1], kNumericList);
      return check_broadcast_rank(r);
    };
    e.formats = [](const LayerRequest& r) {
      // The exponent keeps its logical dtype (a float32 exponent stays float32 under fp16).
      LayerFormats f = broadcast_formats(r);
      f.inputs[1].dtype = r.input_dtypes[1];
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      std::unique_ptr<Layer> layer;
      dispatch_pow_base(f.inputs[0].dtype, [&](auto xtag) {
        dispatch_numeric(f.inputs[1].dtype, [&](auto ytag) {
          using X = decltype(xtag);
          using Y = decltype(ytag);
          layer = binary_layer<X, X, Y>(r, f, PowOp{}, "pow");
        });
      });
      if (!layer) throw r.node.error(ErrorKind::kInternal, "no CUDA Pow kernel for these types");
      return layer;
    };
    e.dtypes = "base float32, float16, bfloat16, float64, int32, int64; exponent any numeric type";
    registry.add(std::move(e));
  }
  for (const char* op : {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"}) {
    const bool allow_bool = std::string(op) == "Equal";
    LayerEntry e;
    e.op = op;
    e.check = [allow_bool](const LayerRequest& r) -> std::string {
      if (auto why = check_inputs_present(r, 2); !why.empty()) return why;
      DType d = r.input_dtypes[0];
      if (!is_numeric(d) && !(allow_bool && d == DType::kBool))
        return dtype_reason("input", d, allow_bool ? "float32, float16, bfloat16, float64, integers, bool"
                                                   : "float32, float16, bfloat16, float64, integers");
      if (r.input_dtypes[1] != d) return "input types differ";
      return check_broadcast_rank(r);
    };
    e.formats = broadcast_formats;
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      std::unique_ptr<Layer> layer;
      if (f.inputs[0].dtype == DType::kBool) layer = comparison_layer<uint8_t>(r, f);
      else dispatch_numeric(f.inputs[0].dtype, [&](auto tag) { layer = comparison_layer<decltype(tag)>(r, f); });
      if (!layer) throw r.node.error(ErrorKind::kInternal, "no CUDA kernel for " + to_string(f.inputs[0].dtype));
      return layer;
    };
    e.dtypes = allow_bool ? "float32, float16, bfloat16, float64, integers, bool" : "float32, float16, bfloat16, float64, integers";
    registry.add(std::move(e));
  }
  for (const char* op : {"And", "Or", "Xor"}) {
    LayerEntry e;
    e.op = op;
    e.check = [](const LayerRequest& r) -> std::string {
      if (auto why = check_inputs_present(r, 2); !why.empty()) return why;
      if (r.input_dtypes[0] != DType::kBool || r.input_dtypes[1] != DType::kBool)
        return dtype_reason("input", r.input_dtypes[0] != DType::kBool ? r.input_dtypes[0] : r.input_dtypes[1], "bool");
      return check_broadcast_rank(r);
    };
    e.formats = broadcast_formats;
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const std::string& op = r.node.op;
      if (op == "And") return binary_layer<uint8_t, uint8_t, uint8_t>(r, f, AndOp{}, "and");
      if (op == "Or") return binary_layer<uint8_t, uint8_t, uint8_t>(r, f, OrOp{}, "or");
      return binary_layer<uint8_t, uint8_t, uint8_t>(r, f, XorOp{}, "xor");
    };
    e.dtypes = "bool";
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "BitShift";
    e.check = [](const LayerRequest& r) -> std::string {
      if (auto why = check_inputs_present(r, 2); !why.empty()) return why;
      if (!dispatch_integer(r.input_dtypes[0], [](auto) {})) return dtype_reason("input", r.input_dtypes[0], "int8..int64, uint8..uint64");
      if (r.input_dtypes[1] != r.input_dtypes[0]) return "input types differ";
      std::string dir = r.node.attrs.get_string("direction", "");
      if (dir != "LEFT" && dir != "RIGHT") return "direction must be LEFT or RIGHT";
      return check_broadcast_rank(r);
    };
    e.formats = broadcast_formats;
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const bool left = r.node.attrs.get_string("direction", "") == "LEFT";
      std::unique_ptr<Layer> layer;
      dispatch_integer(f.inputs[0].dtype, [&](auto tag) {
        using T = decltype(tag);
        if (left) layer = binary_layer<T, T, T>(r, f, ShiftOp<true>{}, "shift_left");
        else layer = binary_layer<T, T, T>(r, f, ShiftOp<false>{}, "shift_right");
      });
      if (!layer) throw r.node.error(ErrorKind::kInternal, "no CUDA kernel for " + to_string(f.inputs[0].dtype));
      return layer;
    };
    e.dtypes = "int8..int64, uint8..uint64";
    registry.add(std::move(e));
  }
  for (const char* op : {"BitwiseAnd", "BitwiseOr", "BitwiseXor"}) {
    LayerEntry e;
    e.op = op;
    e.check = [](const LayerRequest& r) -> std::string {
      if (auto why = check_inputs_present(r, 2); !why.empty()) return why;
      if (!dispatch_integer(r.input_dtypes[0], [](auto) {})) return dtype_reason("input", r.input_dtypes[0], "int8..int64, uint8..uint64");
      if (r.input_dtypes[1] != r.input_dtypes[0]) return "input types differ";
      return check_broadcast_rank(r);
    };
    e.formats = broadcast_formats;
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const std::string& op = r.node.op;
      std::unique_ptr<Layer> layer;
      dispatch_integer(f.inputs[0].dtype, [&](auto tag) {
        using T = decltype(tag);
        if (op == "BitwiseAnd") layer = binary_layer<T, T, T>(r, f, BitwiseOp<Bitwise::kAnd>{}, "bitwise_and");
        else if (op == "BitwiseOr") layer = binary_layer<T, T, T>(r, f, BitwiseOp<Bitwise::kOr>{}, "bitwise_or");
        else layer = binary_layer<T, T, T>(r, f, BitwiseOp<Bitwise::kXor>{}, "bitwise_xor");
      });
      if (!layer) throw r.node.error(ErrorKind::kInternal, "no CUDA kernel for " + to_string(f.inputs[0].dtype));
      return layer;
    };
    e.dtypes = "int8..int64, uint8..uint64";
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "Where";
    e.check = [](const LayerRequest& r) -> std::string {
      if (auto why = check_inputs_present(r, 3); !why.empty()) return why;
      if (r.input_dtypes[0] != DType::kBool) return dtype_reason("condition", r.input_dtypes[0], "bool");
      const size_t size = element_size(r.storage_of(r.input_dtypes[1]));
      if (size != 1 && size != 2 && size != 4 && size != 8)
        return "input type " + to_string(r.input_dtypes[1]) + " is not supported";
      if (r.input_dtypes[2] != r.input_dtypes[1]) return "X and Y types differ";
      return check_broadcast_rank(r);
    };
    e.formats = broadcast_formats;
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const Pass<3> pass = make_pass<3>(r.output_shapes[0], f.outputs[0].layout,
                                        {operand_spec(r, f, 0), operand_spec(r, f, 1), operand_spec(r, f, 2)});
      EnqueueFn fn;
      dispatch_bits(element_size(f.outputs[0].dtype), [&](auto tag) {
        using T = decltype(tag);
        fn = [pass](const LayerIO& io, cudaStream_t stream) {
          run_pass<3, T, uint8_t, T, T>(WhereOp{}, pass, io.outputs[0], io.inputs[0], io.inputs[1], io.inputs[2], stream);
        };
      });
      if (!fn) throw r.node.error(ErrorKind::kInternal, "no CUDA Where kernel for " + to_string(f.outputs[0].dtype));
      return make_layer("kernel:where " + pass.kind(), std::move(fn));
    };
    e.dtypes = "all numeric types, bool";
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "Clip";
    e.check = [](const LayerRequest& r) -> std::string {
      if (!r.has_input(0)) return "input X is missing";
      if (!is_numeric(r.input_dtypes[0])) return dtype_reason("input", r.input_dtypes[0], kNumericList);
      for (size_t i = 1; i < 3; ++i) {
        if (!r.has_input(i)) continue;
        if (r.input_dtypes[i] != r.input_dtypes[0]) return "min/max type differs from X";
        if (r.inputs[i]->elements() != 1) return "min/max must be scalars";
      }
      return "";
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs.resize(r.inputs.size());
      const DType storage = r.storage_of(r.input_dtypes[0]);
      const Layout layout = !r.is_constant(0) && r.inputs[0]->rank() == 4 ? r.inputs[0]->format.layout : Layout::kLinear;
      f.inputs[0] = Format{storage, layout};
      // Constant bounds are read on the host at full precision; runtime bounds on the device.
      for (size_t i = 1; i < r.inputs.size() && i < 3; ++i)
        if (r.has_input(i) && !r.is_constant(i)) f.inputs[i] = Format{storage, Layout::kLinear};
      f.outputs.push_back(Format{storage, layout});
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      std::unique_ptr<Layer> layer;
      dispatch_numeric(f.inputs[0].dtype, [&](auto tag) { layer = clip_layer<decltype(tag)>(r, f); });
      if (!layer) throw r.node.error(ErrorKind::kInternal, "no CUDA Clip kernel for " + to_string(f.inputs[0].dtype));
      return layer;
    };
    e.dtypes = "float32, float16, bfloat16, float64, int8..int64, uint8..uint64";
    registry.add(std::move(e));
  }
  {
    LayerEntry e;
    e.op = "SwiGLU";
    e.check = [](const LayerRequest& r) -> std::string {
      if (auto why = check_inputs_present(r, 2); !why.empty()) return why;
      if (r.input_dtypes[0] != DType::kFloat32 || r.input_dtypes[1] != DType::kFloat32)
        return "input types " + to_string(r.input_dtypes[0]) + ", " + to_string(r.input_dtypes[1]) +
               " are not supported (supported: float32)";
      if (r.input_shape(0) != r.input_shape(1)) return "A and B must have one shape";
      return "";
    };
    e.formats = [](const LayerRequest& r) { return uniform_formats(r, /*float16_ok=*/true, /*nhwc_ok=*/false); };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) { return swiglu_layer(r, f); };
    e.dtypes = "float32, float16 storage";
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cuda
