// CUDA layers of the reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd,
// ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceSumSquare, ArgMax, ArgMin, CumSum and
// CumProd.
//
// A reduction is planned on the host as two strided index spaces over the input's logical
// strides (so a kNHWC input is read where it is): the kept dims (row-major: the output's
// order) and the reduced dims, each with size-1 dims dropped and contiguous runs merged.
// One of three kernels then runs it:
//  - group:  the innermost reduced dim is contiguous: a warp (a 256-thread block for long
//            sets) per output reads it coalesced. ReduceMean over H,W of an NCHW tensor.
//  - column: the innermost kept dim is contiguous: 32 consecutive outputs per block, 8
//            threads each along the reduced set. ReduceMean over H,W of an NHWC tensor.
//  - thread: anything else (and short sets): one thread per output.
// Long sets reduced into few outputs are split over blocks that write partial states to the
// workspace; a last kernel combines them.
//
// The arithmetic follows the CPU kernels (src/cpu/reduce.cc): float32 accumulation for
// float32/float16 storage, double for float64, int64 for integers; Max/Min skip NaN (as
// std::max/std::min from -inf do there); ReduceLogSumExp of integers is 0; ArgMax/ArgMin
// return 0 when the first element is NaN and otherwise skip NaN, ties going to the first
// (or with select_last_index the last) index.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "ops/reduce.h"

namespace kiln::cuda {

namespace {

enum class Red { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare, kArg };

Red red_of(const std::string& op) {
  if (op == "ReduceSum") return Red::kSum;
  if (op == "ReduceMean") return Red::kMean;
  if (op == "ReduceMax") return Red::kMax;
  if (op == "ReduceMin") return Red::kMin;
  if (op == "ReduceProd") return Red::kProd;
  if (op == "ReduceL1") return Red::kL1;
  if (op == "ReduceL2") return Red::kL2;
  if (op == "ReduceLogSum") return Red::kLogSum;
  if (op == "ReduceLogSumExp") return Red::kLogSumExp;
  if (op == "ReduceSumSquare") return Red::kSumSquare;
  return Red::kArg;
}

// --- device arithmetic -------------------------------------------------------------------

template <class T> struct AccOf { using type = std::conditional_t<std::is_integral_v<T>, int64_t, float>; };
template <> struct AccOf<double> { using type = double; };
template <class T> using acc_t = typename AccOf<T>::type;
// Float storage (float32, float16, float64): NaN and infinities exist.
template <class T> inline constexpr bool kIsFloat = !std::is_integral_v<T>;

template <class Acc, class T> __device__ __forceinline__ Acc to_acc(T v) {
  if constexpr (std::is_same_v<T, __half>) return static_cast<Acc>(__half2float(v));
  else return static_cast<Acc>(v);
}

template <class Out, class V> __device__ __forceinline__ Out to_out(V v) {
  if constexpr (std::is_same_v<Out, __half>) return __float2half_rn(static_cast<float>(v));
  else return static_cast<Out>(v);
}

template <class A> __device__ __forceinline__ bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>) return v != v;
  else return false;
}

template <class A> __device__ __forceinline__ A dev_exp(A v) {
  if constexpr (std::is_same_v<A, float>) return expf(v);
  else return exp(v);
}

template <class A> __device__ __forceinline__ A dev_log(A v) {
  if constexpr (std::is_same_v<A, float>) return logf(v);
  else return log(v);
}

template <class A> struct LseState { A m, s; };       // max, sum of exp(x - max)
template <class A> struct ArgState { A v; int64_t i; int nan0; };  // best value and index

template <class T> __device__ __forceinline__ T shfl_down(T v, int d) { return __shfl_down_sync(0xffffffffu, v, d); }
template <class A> __device__ __forceinline__ LseState<A> shfl_down(LseState<A> v, int d) {
  return {shfl_down(v.m, d), shfl_down(v.s, d)};
}
template <class A> __device__ __forceinline__ ArgState<A> shfl_down(ArgState<A> v, int d) {
  return {shfl_down(v.v, d), shfl_down(v.i, d), shfl_down(v.nan0, d)};
}

// One reduction: a partial state, its update by one element (r: the element's index in the
// set), the combination of two partial states, and the output value of a final state.
template <Red K, class In, class Out>
struct Reducer {
  using Acc = acc_t<In>;
  using State = std::conditional_t<K == Red::kLogSumExp, LseState<Acc>,
                                   std::conditional_t<K == Red::kArg, ArgState<Acc>, Acc>>;

  bool is_max = true;  // kArg: ArgMax (else ArgMin)
  bool last = false;   // kArg: select_last_index

  __device__ static Acc lowest() {
    if constexpr (kIsFloat<In>) return -static_cast<Acc>(INFINITY);
    else return static_cast<Acc>(std::numeric_limits<In>::lowest());
  }
  __device__ static Acc highest() {
    if constexpr (kIsFloat<In>) return static_cast<Acc>(INFINITY);
    else return static_cast<Acc>(std::numeric_limits<In>::max());
  }

  __device__ State init() const {
    State s;
    if constexpr (K == Red::kMax) s = lowest();
    else if constexpr (K == Red::kMin) s = highest();
    else if constexpr (K == Red::kProd) s = Acc(1);
    else if constexpr (K == Red::kLogSumExp) { s.m = -static_cast<Acc>(INFINITY); s.s = Acc(0); }
    else if constexpr (K == Red::kArg) { s.v = Acc(0); s.i = -1; s.nan0 = 0; }
    else s = Acc(0);
    return s;
  }

  // kArg: whether (v, i) goes before the best so far (bv, bi).
  __device__ bool better(Acc v, int64_t i, Acc bv, int64_t bi) const {
    if (bi < 0) return true;
    if (v == bv) return last ? i > bi : i < bi;
    return is_max ? v > bv : v < bv;
  }

  __device__ void update(State& s, In raw, int64_t r) const {
    const Acc v = to_acc<Acc>(raw);
    if constexpr (K == Red::kSum || K == Red::kMean) {
      s += v;
    } else if constexpr (K == Red::kMax) {
      s = s < v ? v : s;
    } else if constexpr (K == Red::kMin) {
      s = v < s ? v : s;
    } else if constexpr (K == Red::kProd) {
      s *= v;
    } else if constexpr (K == Red::kL1) {
      s += v < Acc(0) ? -v : v;
    } else if constexpr (K == Red::kL2 || K == Red::kSumSquare) {
      s += v * v;
    } else if constexpr (K == Red::kLogSum) {
      s += v;
    } else if constexpr (K == Red::kLogSumExp) {
      // -inf adds exp(-inf - max) = 0 whenever the max is finite (and an infinite max is the
      // result); skipping it keeps -inf - -inf = NaN out of the sum.
      if (v == -static_cast<Acc>(INFINITY)) return;
      if (s.m < v) {
        s.s = s.s * dev_exp(s.m - v) + Acc(1);
        s.m = v;
      } else {
        s.s += dev_exp(v - s.m);  // NaN stays NaN, as on the CPU
      }
    } else {  // kArg
      if (is_nan(v)) {
        if (r == 0) s.nan0 = 1;  // the CPU keeps index 0 when element 0 is NaN
        return;
      }
      if (better(v, r, s.v, s.i)) {
        s.v = v;
        s.i = r;
      }
    }
  }

  __device__ State combine(State a, State b) const {
    if constexpr (K == Red::kMax) {
      return a < b ? b : a;
    } else if constexpr (K == Red::kMin) {
      return b < a ? b : a;
    } else if constexpr (K == Red::kProd) {
      return a * b;
    } else if constexpr (K == Red::kLogSumExp) {
      const Acc ninf = -static_cast<Acc>(INFINITY);
      if (b.m == ninf) { a.s += b.s; return a; }  // b.s: 0, or NaN from NaN elements
      if (a.m == ninf) { b.s += a.s; return b; }
      const Acc m = a.m < b.m ? b.m : a.m;
      return {m, a.s * dev_exp(a.m - m) + b.s * dev_exp(b.m - m)};
    } else if constexpr (K == Red::kArg) {
      const int nan0 = a.nan0 | b.nan0;
      State w = (b.i >= 0 && better(b.v, b.i, a.v, a.i)) ? b : a;
      w.nan0 = nan0;
      return w;
    } else {
      return a + b;
    }
  }

  __device__ Out finalize(State s, int64_t n) const {
    if constexpr (K == Red::kMean) {
      if constexpr (kIsFloat<In>) return to_out<Out>(n ? s / static_cast<Acc>(n) : static_cast<Acc>(NAN));
      else return to_out<Out>(n ? s / n : Acc(0));
    } else if constexpr (K == Red::kL2) {
      return to_out<Out>(sqrt(static_cast<double>(s)));
    } else if constexpr (K == Red::kLogSum) {
      return to_out<Out>(log(static_cast<double>(s)));
    } else if constexpr (K == Red::kLogSumExp) {
      if (s.m == static_cast<Acc>(INFINITY) || s.m == -static_cast<Acc>(INFINITY)) return to_out<Out>(s.m);
      return to_out<Out>(s.m + dev_log(s.s));
    } else if constexpr (K == Red::kArg) {
      return static_cast<Out>(s.nan0 || s.i < 0 ? 0 : s.i);
    } else {
      return to_out<Out>(s);
    }
  }
};

// --- kernels -------------------------------------------------------------------------------

struct Geom {
  StridedShape kept;  // output index -> offset of its set's first element
  StridedShape red;   // index in the set -> offset from there
  int64_t outputs = 0, n = 0;
};

constexpr int kBlock = 256;

// The state of each group of WIDTH lanes, in the group's first lane. All 32 lanes call it.
template <int WIDTH = 32, class R, class S>
__device__ __forceinline__ S warp_combine(const R& red, S s) {
#pragma unroll
  for (int d = WIDTH / 2; d > 0; d >>= 1) s = red.combine(s, shfl_down(s, d));
  return s;
}

// The state of the whole block, in thread 0. Every thread of the block must call it.
template <class R, class S>
__device__ __forceinline__ S block_combine(const R& red, S s, S* smem) {
  s = warp_combine(red, s);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) smem[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = lane < static_cast<int>(blockDim.x >> 5) ? smem[lane] : red.init();
    s = warp_combine(red, s);
  }
  __syncthreads();
  return s;
}

template <class R, class In, class Out>
__device__ __forceinline__ void write_result(const R& red, const Geom& g, Out* y, typename R::State* partial,
                                             int splits, int64_t task, typename R::State s) {
  if (splits == 1) y[task] = red.finalize(s, g.n);
  else partial[task] = s;
}

// GROUP threads (8 lanes, a warp or the block) per task; a task is one split of one
// output's set, whose innermost dim is contiguous. The loop is uniform over the block (the
// combines need every lane).
template <class R, class In, class Out, int GROUP>
__global__ void __launch_bounds__(kBlock) reduce_group_kernel(const In* __restrict__ x, Out* __restrict__ y,
                                                              typename R::State* __restrict__ partial, R red,
                                                              Geom g, int splits, int64_t chunk) {
  using S = typename R::State;
  __shared__ S smem[kBlock / 32];
  constexpr int kGroups = kBlock / GROUP;
  const int lane = static_cast<int>(threadIdx.x) % GROUP, group = static_cast<int>(threadIdx.x) / GROUP;
  const int64_t tasks = g.outputs * splits;
  for (int64_t first = int64_t{blockIdx.x} * kGroups; first < tasks; first += int64_t{gridDim.x} * kGroups) {
    const int64_t t = first + group;
    S s = red.init();
    if (t < tasks) {
      const int64_t o = t / splits, part = t % splits;
      const int64_t begin = part * chunk, end = min(g.n, begin + chunk);
      const In* xo = x + strided_offset(g.kept, o);
      if (g.red.rank == 1) {
        for (int64_t r = begin + lane; r < end; r += GROUP) red.update(s, xo[r], r);
      } else {
        for (int64_t r = begin + lane; r < end; r += GROUP) red.update(s, xo[strided_offset(g.red, r)], r);
      }
    }
    if constexpr (GROUP <= 32) s = warp_combine<GROUP>(red, s);
    else s = block_combine(red, s, smem);
    if (lane == 0 && t < tasks) write_result<R, In, Out>(red, g, y, partial, splits, t, s);
  }
}

// 32 consecutive outputs per block (the innermost kept dim is contiguous), 8 threads along
// each output's set; blockIdx.y is the split.
template <class R, class In, class Out>
__global__ void __launch_bounds__(kBlock) reduce_column_kernel(const In* __restrict__ x, Out* __restrict__ y,
                                                               typename R::State* __restrict__ partial, R red,
                                                               Geom g, int splits, int64_t chunk) {
  using S = typename R::State;
  constexpr int kRows = kBlock / 32;
  __shared__ S smem[kRows][32];
  const int tx = static_cast<int>(threadIdx.x) & 31, ty = static_cast<int>(threadIdx.x) >> 5;
  const int64_t tiles = (g.outputs + 31) / 32;
  const int64_t part = blockIdx.y;
  const int64_t begin = part * chunk, end = min(g.n, begin + chunk);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t o = tile * 32 + tx;
    S s = red.init();
    if (o < g.outputs) {
      const In* xo = x + strided_offset(g.kept, o);
      if (g.red.rank == 1) {
        const int64_t stride = g.red.strides[0];
        for (int64_t r = begin + ty; r < end; r += kRows) red.update(s, xo[r * stride], r);
      } else {
        for (int64_t r = begin + ty; r < end; r += kRows) red.update(s, xo[strided_offset(g.red, r)], r);
      }
    }
    smem[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && o < g.outputs) {
      for (int k = 1; k < kRows; ++k) s = red.combine(s, smem[k][tx]);
      write_result<R, In, Out>(red, g, y, partial, splits, o * splits + part, s);
    }
    __syncthreads();
  }
}

// One thread per output (short sets, or no contiguous dim to read along).
template <class R, class In, class Out>
__global__ void __launch_bounds__(kBlock) reduce_thread_kernel(const In* __restrict__ x, Out* __restrict__ y, R red,
                                                               Geom g) {
  for (int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; o < g.outputs;
       o += int64_t{gridDim.x} * blockDim.x) {
    const In* xo = x + strided_offset(g.kept, o);
    typename R::State s = red.init();
    for (int64_t r = 0; r < g.n; ++r) red.update(s, xo[strided_offset(g.red, r)], r);
    y[o] = red.finalize(s, g.n);
  }
}

// Combines the `splits` partial states of each output (in order) and writes the result.
template <class R, class Out>
__global__ void __launch_bounds__(kBlock) reduce_finish_kernel(const typename R::State* __restrict__ partial,
                                                               Out* __restrict__ y, R red, Geom g, int splits) {
  for (int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; o < g.outputs;
       o += int64_t{gridDim.x} * blockDim.x) {
    typename R::State s = partial[o * splits];
    for (int p = 1; p < splits; ++p) s = red.combine(s, partial[o * splits + p]);
    y[o] = red.finalize(s, g.n);
  }
}

// --- planning ------------------------------------------------------------------------------

enum class Mode { kGroup8, kGroupWarp, kGroupBlock, kColumn, kThread };

struct Plan {
  Geom g;
  Mode mode = Mode::kThread;
  int splits = 1;
  int64_t chunk = 1;
  unsigned blocks = 1;
};

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kGroup8: return "group8";
    case Mode::kGroupWarp: return "warp";
    case Mode::kGroupBlock: return "block";
    case Mode::kColumn: return "column";
    case Mode::kThread: return "thread";
  }
  return "?";
}

// The geometry of reducing `axes` (sorted) of a tensor with these logical dims and strides.
// `reorder`: the set's order does not matter (Reduce*), so its dims go outermost stride first.
std::string make_geom(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                      const std::vector<int64_t>& axes, bool reorder, Geom& g) {
  std::vector<std::pair<int64_t, int64_t>> kept, red;
  g.outputs = 1;
  g.n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(d))) {
      red.emplace_back(shape[d], strides[d]);
      g.n *= shape[d];
    } else {
      kept.emplace_back(shape[d], strides[d]);
      g.outputs *= shape[d];
    }
  }
  if (reorder)
    std::stable_sort(red.begin(), red.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  if (!merge_dims(kept, g.kept) || !merge_dims(red, g.red))
    return "more than " + std::to_string(kMaxKernelRank) + " dims remain after merging contiguous ones";
  if (g.n == 0 || g.outputs == 0) g.red = StridedShape{};
  return "";
}

Plan choose_plan(const Geom& g, int sms) {
  Plan p;
  p.g = g;
  p.chunk = std::max<int64_t>(g.n, 1);
  const int64_t target_blocks = 4 * static_cast<int64_t>(std::max(sms, 1));
  const bool red_contiguous = g.red.rank >= 1 && g.red.strides[g.red.rank - 1] == 1;
  const bool kept_contiguous = g.kept.rank >= 1 && g.kept.strides[g.kept.rank - 1] == 1;
  if (g.n >= 8 && red_contiguous) {
    if (g.n < 128) {
      p.mode = Mode::kGroup8;  // short sets: 8 lanes each, 4 outputs per warp
      p.blocks = capped_blocks((g.outputs + kBlock / 8 - 1) / (kBlock / 8));
    } else if (g.n >= 2048) {
      p.mode = Mode::kGroupBlock;
      if (g.outputs < target_blocks)
        p.splits = static_cast<int>(std::clamp<int64_t>(std::min(target_blocks / g.outputs, g.n / 4096), 1, 128));
      p.chunk = (g.n + p.splits - 1) / p.splits;
      p.blocks = capped_blocks(g.outputs * p.splits);
    } else {
      p.mode = Mode::kGroupWarp;
      p.blocks = capped_blocks((g.outputs + kBlock / 32 - 1) / (kBlock / 32));
    }
  } else if (g.n >= 8 && kept_contiguous) {
    p.mode = Mode::kColumn;
    const int64_t tiles = (g.outputs + 31) / 32;
    if (tiles < target_blocks && g.n >= 1024)
      p.splits = static_cast<int>(std::clamp<int64_t>(std::min(target_blocks / tiles, g.n / 512), 1, 128));
    p.chunk = (g.n + p.splits - 1) / p.splits;
    p.blocks = capped_blocks(tiles);
  } else {
    p.mode = Mode::kThread;
    p.blocks = capped_blocks((g.outputs + kBlock - 1) / kBlock);
  }
  return p;
}

template <Red K, class In, class Out>
std::unique_ptr<Layer> reduce_layer(const Plan& p, Reducer<K, In, Out> red, const std::string& tactic) {
  using R = Reducer<K, In, Out>;
  using S = typename R::State;
  const size_t workspace = p.splits > 1 ? static_cast<size_t>(p.g.outputs * p.splits) * sizeof(S) : 0;
  return make_layer(tactic, [p, red](const LayerIO& io, cudaStream_t stream) {
    const In* x = static_cast<const In*>(io.inputs[0]);
    Out* y = static_cast<Out*>(io.outputs[0]);
    S* partial = static_cast<S*>(io.workspace);
    switch (p.mode) {
      case Mode::kGroup8:
        reduce_group_kernel<R, In, Out, 8><<<p.blocks, kBlock, 0, stream>>>(x, y, partial, red, p.g, p.splits, p.chunk);
        break;
      case Mode::kGroupWarp:
        reduce_group_kernel<R, In, Out, 32><<<p.blocks, kBlock, 0, stream>>>(x, y, partial, red, p.g, p.splits, p.chunk);
        break;
      case Mode::kGroupBlock:
        reduce_group_kernel<R, In, Out, kBlock><<<p.blocks, kBlock, 0, stream>>>(x, y, partial, red, p.g, p.splits, p.chunk);
        break;
      case Mode::kColumn:
        reduce_column_kernel<R, In, Out><<<dim3(p.blocks, static_cast<unsigned>(p.splits)), kBlock, 0, stream>>>(
            x, y, partial, red, p.g, p.splits, p.chunk);
        break;
      case Mode::kThread:
        reduce_thread_kernel<R, In, Out><<<p.blocks, kBlock, 0, stream>>>(x, y, red, p.g);
        break;
    }
    KILN_CUDA_CHECK_LAUNCH();
    if (p.splits > 1) {
      reduce_finish_kernel<R, Out><<<capped_blocks((p.g.outputs + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
          partial, y, red, p.g, p.splits);
      KILN_CUDA_CHECK_LAUNCH();
    }
  }, workspace);
}

// The layer for input storage type In; `out` is the output's storage dtype.
template <Red K, class In>
std::unique_ptr<Layer> reduce_layer_for(const ir::Node& node, const Plan& p, DType in, DType out, bool is_max,
                                        bool last, const std::string& tactic) {
  if constexpr (K == Red::kArg) {
    return reduce_layer<K, In, int64_t>(p, Reducer<K, In, int64_t>{is_max, last}, tactic);
  } else if constexpr (K == Red::kLogSumExp && std::is_integral_v<In>) {
    // The CPU kernel's ReduceLogSumExp of integers is 0.
    const size_t bytes = static_cast<size_t>(p.g.outputs) * sizeof(In);
    return make_layer("kernel:reduce-zero", [bytes](const LayerIO& io, cudaStream_t stream) {
      KILN_CUDA_CHECK(cudaMemsetAsync(io.outputs[0], 0, bytes, stream));
    });
  } else {
    if (out == in)
      return reduce_layer<K, In, In>(p, Reducer<K, In, In>{}, tactic);
    if constexpr (std::is_same_v<In, __half> && (K == Red::kProd || K == Red::kSumSquare || K == Red::kSum || K == Red::kL1)) {
      if (out == DType::kFloat32) return reduce_layer<K, __half, float>(p, Reducer<K, __half, float>{}, tactic);
    }
    throw node.error(ErrorKind::kInternal, "no reduction kernel from " + to_string(in) + " to " + to_string(out));
  }
}

template <Red K>
std::unique_ptr<Layer> reduce_layer_typed(const ir::Node& node, const Plan& p, DType in, DType out, bool is_max,
                                          bool last, const std::string& tactic) {
  switch (in) {
    case DType::kFloat32: return reduce_layer_for<K, float>(node, p, in, out, is_max, last, tactic);
    case DType::kFloat16: return reduce_layer_for<K, __half>(node, p, in, out, is_max, last, tactic);
    case DType::kFloat64: return reduce_layer_for<K, double>(node, p, in, out, is_max, last, tactic);
    case DType::kInt32: return reduce_layer_for<K, int32_t>(node, p, in, out, is_max, last, tactic);
    case DType::kInt64: return reduce_layer_for<K, int64_t>(node, p, in, out, is_max, last, tactic);
    case DType::kInt8: return reduce_layer_for<K, int8_t>(node, p, in, out, is_max, last, tactic);
    case DType::kUInt8: return reduce_layer_for<K, uint8_t>(node, p, in, out, is_max, last, tactic);
    case DType::kBool:  // any/all: 0/1 bytes through the uint8 kernel, as on the CPU
      if constexpr (K == Red::kMax || K == Red::kMin)
        return reduce_layer_for<K, uint8_t>(node, p, in, out, is_max, last, tactic);
      break;
    default: break;
  }
  throw node.error(ErrorKind::kUnsupported, "input type " + to_string(in) + " has no reduction kernel");
}

std::unique_ptr<Layer> reduce_layer_kind(Red kind, const ir::Node& node, const Plan& p, DType in, DType out,
                                         bool is_max, bool last, const std::string& tactic) {
  switch (kind) {
    case Red::kSum: return reduce_layer_typed<Red::kSum>(node, p, in, out, is_max, last, tactic);
    case Red::kMean: return reduce_layer_typed<Red::kMean>(node, p, in, out, is_max, last, tactic);
    case Red::kMax: return reduce_layer_typed<Red::kMax>(node, p, in, out, is_max, last, tactic);
    case Red::kMin: return reduce_layer_typed<Red::kMin>(node, p, in, out, is_max, last, tactic);
    case Red::kProd: return reduce_layer_typed<Red::kProd>(node, p, in, out, is_max, last, tactic);
    case Red::kL1: return reduce_layer_typed<Red::kL1>(node, p, in, out, is_max, last, tactic);
    case Red::kL2: return reduce_layer_typed<Red::kL2>(node, p, in, out, is_max, last, tactic);
    case Red::kLogSum: return reduce_layer_typed<Red::kLogSum>(node, p, in, out, is_max, last, tactic);
    case Red::kLogSumExp: return reduce_layer_typed<Red::kLogSumExp>(node, p, in, out, is_max, last, tactic);
    case Red::kSumSquare: return reduce_layer_typed<Red::kSumSquare>(node, p, in, out, is_max, last, tactic);
    case Red::kArg: return reduce_layer_typed<Red::kArg>(node, p, in, out, is_max, last, tactic);
  }
  throw node.error(ErrorKind::kInternal, "unknown reduction");
}

// --- Reduce* and ArgMax/ArgMin: check, formats, create -----------------------------------

bool numeric_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kFloat64 || d == DType::kInt32 ||
         d == DType::kInt64 || d == DType::kInt8 || d == DType::kUInt8;
}

// Reduced axes of a Reduce* node (sorted); `noop` for the identity.
std::vector<int64_t> reduce_axes_of(const LayerRequest& r, bool* noop) {
  std::optional<std::vector<int64_t>> axes;
  if (r.is_constant(1)) axes = r.constants[1]->to_int_vector();
  return ir::reduce_axes(r.node, axes, static_cast<int64_t>(r.input_shape(0).size()), noop);
}

std::vector<int64_t> arg_axis_of(const LayerRequest& r) {
  const int64_t rank = static_cast<int64_t>(r.input_shape(0).size());
  int64_t axis = r.node.attrs.get_int("axis", 0);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= std::max<int64_t>(rank, 1))
    throw r.node.error(ErrorKind::kInvalidModel, "axis is out of range for rank " + std::to_string(rank));
  return rank == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{axis};
}

// Row-major strides of a shape.
std::vector<int64_t> linear_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

std::string check_reduce(const LayerRequest& r) {
  const Red kind = red_of(r.node.op);
  const DType d = r.input_dtypes[0];
  const bool bool_ok = d == DType::kBool && (kind == Red::kMax || kind == Red::kMin);
  if (!numeric_dtype(d) && !bool_ok)
    return "input type " + to_string(d) + " is not supported (supported: float32, float16, float64, int32, int64, "
           "int8, uint8" + std::string(kind == Red::kMax || kind == Red::kMin ? ", bool)" : ")");
  if (kind != Red::kArg && r.has_input(1) && !r.is_constant(1)) return "axes must be a constant";
  try {
    bool noop = false;
    std::vector<int64_t> axes = kind == Red::kArg ? arg_axis_of(r) : reduce_axes_of(r, &noop);
    if (noop) return "";
    Geom g;
    const std::vector<int64_t>& shape = r.input_shape(0);
    return make_geom(shape, linear_strides(shape), axes, kind != Red::kArg, g);
  } catch (const Error& e) {
    return e.what();
  }
}

// Whether the reduction can read input 0 in the layout it is stored in now.
bool keeps_layout(const LayerRequest& r, const std::vector<int64_t>& axes, bool reorder) {
  if (!r.has_input(0) || r.is_constant(0) || r.inputs[0]->format.layout != Layout::kNHWC) return false;
  if (r.inputs[0]->rank() != 4) return false;
  Geom g;
  return make_geom(r.input_shape(0), r.inputs[0]->logical_strides(), axes, reorder, g).empty();
}

// Products and sums overflow float16 easily (a sum of 70,000 ones is already inf): under
// kFp16 ReduceProd, ReduceSumSquare, ReduceSum and ReduceL1 keep a float32 output (and read a
// float16 input as it is).
bool fp32_output(const LayerRequest& r, Red kind) {
  return (kind == Red::kProd || kind == Red::kSumSquare || kind == Red::kSum || kind == Red::kL1) &&
         r.input_dtypes[0] == DType::kFloat32;
}

LayerFormats reduce_formats(const LayerRequest& r) {
  const Red kind = red_of(r.node.op);
  LayerFormats f;
  f.inputs.resize(r.inputs.size());
  const DType logical = r.input_dtypes[0];
  bool noop = false;
  std::vector<int64_t> axes = kind == Red::kArg ? arg_axis_of(r) : reduce_axes_of(r, &noop);
  const DType storage = r.storage_of(logical);
  if (noop) {
    f.inputs[0] = Format{storage, Layout::kLinear};
    f.outputs.push_back(Format{storage, Layout::kLinear});
    return f;
  }
  const Layout layout = keeps_layout(r, axes, kind != Red::kArg) ? Layout::kNHWC : Layout::kLinear;
  DType in = storage, out = storage;
  if (kind == Red::kArg) {
    out = DType::kInt64;
    // The output is an index: a float input is read in whichever float storage it has.
    const DType now = r.is_constant(0) ? DType::kUndefined : r.inputs[0]->format.dtype;
    if (logical == DType::kFloat32 && (now == DType::kFloat32 || now == DType::kFloat16)) in = now;
  } else if (fp32_output(r, kind)) {
    out = DType::kFloat32;
    in = !r.is_constant(0) && r.inputs[0]->format.dtype == DType::kFloat16 ? DType::kFloat16 : DType::kFloat32;
  }
  f.inputs[0] = Format{in, layout};
  f.outputs.push_back(Format{out, Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> reduce_create(const LayerRequest& r, const LayerFormats& f, BuildServices& services) {
  const Red kind = red_of(r.node.op);
  const TensorSpec& x = *r.inputs[0];
  const int64_t outputs = shape_numel(r.output_shapes[0]);
  bool noop = false;
  std::vector<int64_t> axes = kind == Red::kArg ? arg_axis_of(r) : reduce_axes_of(r, &noop);
  if (noop) {
    const size_t bytes = x.bytes();
    return make_layer("kernel:copy", [bytes](const LayerIO& io, cudaStream_t stream) {
      if (bytes) KILN_CUDA_CHECK(cudaMemcpyAsync(io.outputs[0], io.inputs[0], bytes, cudaMemcpyDeviceToDevice, stream));
    });
  }
  Geom g;
  std::string why = make_geom(x.shape, x.logical_strides(), axes, kind != Red::kArg, g);
  if (!why.empty()) throw r.node.error(ErrorKind::kUnsupported, why);
  if (g.outputs != outputs) throw r.node.error(ErrorKind::kInternal, "reduction output size mismatch");
  if (kind == Red::kArg && g.n == 0 && outputs > 0)
    throw r.node.error(ErrorKind::kInvalidArgument, "the reduced axis has size 0");
  if (outputs == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  const Plan p = choose_plan(g, services.device().multiProcessorCount);
  std::string tactic = std::string("kernel:reduce-") + mode_name(p.mode);
  if (p.splits > 1) tactic += " splits=" + std::to_string(p.splits);
  const bool is_max = r.node.op == "ArgMax";
  const bool last = r.node.attrs.get_int("select_last_index", 0) != 0;
  return reduce_layer_kind(kind, r.node, p, f.inputs[0].dtype, f.outputs[0].dtype, is_max, last, tactic);
}

// --- CumSum --------------------------------------------------------------------------------

// One thread per line of [outer, n, inner] (coalesced over inner), sequential along n: the CPU
// kernel's order. kProduct: CumProd (products in the element type, integers wrapping, as there).
template <class T, bool kIntegral = std::is_integral_v<T>> struct ProductAcc { using type = acc_t<T>; };
template <class T> struct ProductAcc<T, true> { using type = std::make_unsigned_t<T>; };  // wraps, as the CPU's

template <class T, bool kProduct = false>
__global__ void __launch_bounds__(kBlock) cumsum_lines_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                              int64_t outer, int64_t n, int64_t inner,
                                                              bool exclusive, bool reverse) {
  using Acc = std::conditional_t<kProduct, typename ProductAcc<T>::type, acc_t<T>>;
  const int64_t lines = outer * inner;
  for (int64_t l = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; l < lines; l += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = l / inner, i = l - o * inner;
    const int64_t base = o * n * inner + i;
    Acc acc = kProduct ? Acc(1) : Acc(0);
    for (int64_t s = 0; s < n; ++s) {
      const int64_t at = base + (reverse ? n - 1 - s : s) * inner;
      const Acc v = static_cast<Acc>(to_acc<acc_t<T>>(x[at]));
      if (exclusive) {
        y[at] = to_out<T>(acc);
        acc = kProduct ? static_cast<Acc>(acc * v) : static_cast<Acc>(acc + v);
      } else {
        acc = kProduct ? static_cast<Acc>(acc * v) : static_cast<Acc>(acc + v);
        y[at] = to_out<T>(acc);
      }
    }
  }
}

// One warp per contiguous row (inner == 1): 32 elements per step, a warp scan plus a carry.
template <class T>
__global__ void __launch_bounds__(kBlock) cumsum_rows_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                             int64_t rows, int64_t n, bool exclusive, bool reverse) {
  using Acc = acc_t<T>;
  constexpr int kWarps = kBlock / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  for (int64_t row = int64_t{blockIdx.x} * kWarps + warp; row < rows; row += int64_t{gridDim.x} * kWarps) {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    Acc carry = 0;
    for (int64_t s0 = 0; s0 < n; s0 += 32) {
      const int64_t s = s0 + lane;
      const bool ok = s < n;
      const int64_t j = reverse ? n - 1 - s : s;
      const Acc v = ok ? to_acc<Acc>(xr[j]) : Acc(0);
      Acc incl = v;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const Acc t = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += t;
      }
      Acc excl = __shfl_up_sync(0xffffffffu, incl, 1);
      if (lane == 0) excl = 0;
      if (ok) yr[j] = to_out<T>(carry + (exclusive ? excl : incl));
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
  }
}

bool cumsum_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kFloat64 || d == DType::kInt32 ||
         d == DType::kInt64;
}

std::string check_cumsum(const LayerRequest& r) {
  const DType d = r.input_dtypes[0];
  if (!cumsum_dtype(d))
    return "input type " + to_string(d) + " is not supported (supported: float32, float16, float64, int32, int64)";
  if (!r.is_constant(1)) return "axis must be a constant";
  return "";
}

LayerFormats cumsum_formats(const LayerRequest& r) {
  LayerFormats f;
  f.inputs.resize(r.inputs.size());
  const DType storage = r.storage_of(r.input_dtypes[0]);
  f.inputs[0] = Format{storage, Layout::kLinear};
  f.outputs.push_back(Format{storage, Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> cumsum_create(const LayerRequest& r, const LayerFormats& f, BuildServices& services) {
  const std::vector<int64_t>& shape = r.input_shape(0);
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (r.constants[1]->numel() != 1) throw r.node.error(ErrorKind::kInvalidModel, "axis must have one element");
  const int64_t a = r.constants[1]->value_as_int(0);
  if (a < -rank || a >= rank)
    throw r.node.error(ErrorKind::kInvalidArgument, "axis " + std::to_string(a) + " is out of range");
  const size_t axis = static_cast<size_t>(a < 0 ? a + rank : a);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t n = shape[axis];
  const bool exclusive = r.node.attrs.get_int("exclusive", 0) != 0;
  const bool reverse = r.node.attrs.get_int("reverse", 0) != 0;
  if (outer * n * inner == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  const bool product = r.node.op == "CumProd";
  const bool rows = !product && inner == 1 && n >= 32;
  const DType dtype = f.inputs[0].dtype;
  return make_layer(product ? "kernel:cumprod-thread" : rows ? "kernel:cumsum-warp" : "kernel:cumsum-thread",
                    [=](const LayerIO& io, cudaStream_t stream) {
    KILN_DISPATCH_ALL_TYPES(dtype, T, [&] {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, double> ||
                    std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>) {
        const T* x = static_cast<const T*>(io.inputs[0]);
        T* y = static_cast<T*>(io.outputs[0]);
        if (product) {
          cumsum_lines_kernel<T, true><<<capped_blocks((outer * inner + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
              x, y, outer, n, inner, exclusive, reverse);
        } else if (rows) {
          cumsum_rows_kernel<T><<<capped_blocks((outer + kBlock / 32 - 1) / (kBlock / 32)), kBlock, 0, stream>>>(
              x, y, outer, n, exclusive, reverse);
        } else {
          cumsum_lines_kernel<T><<<capped_blocks((outer * inner + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
              x, y, outer, n, inner, exclusive, reverse);
        }
        KILN_CUDA_CHECK_LAUNCH();
      } else {
        throw Error(ErrorKind::kInternal, "CumSum has no kernel for " + to_string(dtype));
      }
    });
  });
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(reduce) {
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin"}) {
    LayerEntry e;
    e.op = op;
    e.check = check_reduce;
    e.formats = reduce_formats;
    e.create = reduce_create;
    const std::string name = op;
    if (name == "ArgMax" || name == "ArgMin")
      e.dtypes = "float32, float16, float64, int32, int64, int8, uint8";
    else if (name == "ReduceMax" || name == "ReduceMin")
      e.dtypes = "float32, float16, float64, int32, int64, int8, uint8, bool";
    else if (name == "ReduceProd" || name == "ReduceSumSquare")
      e.dtypes = "float32 (float32 output under fp16), float64, int32, int64, int8, uint8";
    else
      e.dtypes = "float32, float16, float64, int32, int64, int8, uint8";
    registry.add(std::move(e));
  }
  for (const char* op : {"CumSum", "CumProd"}) {
    LayerEntry c;
    c.op = op;
    c.check = check_cumsum;
    c.formats = cumsum_formats;
    c.create = cumsum_create;
    c.dtypes = "float32, float16, float64, int32, int64";
    registry.add(std::move(c));
  }
}

}  // namespace kiln::cuda
