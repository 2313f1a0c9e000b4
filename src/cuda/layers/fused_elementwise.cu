// CUDA layer of kiln::FusedElementwise (ops/fused_elementwise.h): one kernel runs a group's
// program over its output, reading each input where it lies and writing the output once.
//
// The program travels in the launch parameters and the kernel interprets it: every thread takes
// V neighbouring output elements (8 of float16, 4 of float32) and runs the steps over them, each
// step's operands read from memory (inputs), from the accumulator (the previous step's result)
// or from one of four register arrays (results read later). The step, its op and its operands
// are the same for every thread, so the dispatch is a uniform branch per step and V elements,
// not per element. The interpreter serves every group. Each group also has kernels of its own,
// generated as straight-line code and compiled with NVRTC while the engine builds
// (fused_elementwise_source.h; their cubin goes into the engine file). Each group times the
// interpreter's variants (one loading ahead while it computes; for chains, one running each step
// over 2 or 4 vectors) and its generated kernels, each checked bit for bit against the
// interpreter, and keeps the fastest (docs/design/gpu-engine.md, "Elementwise groups: one pass
// each").
//
// Inputs are read in the layout they are stored in. Each is classified against the output's
// memory order: the output's own shape and layout (read as it is), a block repeated over the
// leading dims (a per-channel vector: offset = (i / repeat) % count), one value, or any other
// broadcast (offsets from strides, element by element). A concatenation's parts are read in
// place: the output's rows split at the concatenated axis, each piece from its part. Constant
// inputs are uploaded as float32, whatever the storage.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/kernels/bitwise_difference.h"
#include "cuda/kernels/common.cuh"
#include "cuda/layers/fused_elementwise_source.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/runtime_compiler.h"
#include "ops/fused_elementwise.h"

namespace kiln::cuda {

namespace {

constexpr int kMaxOperands = 8;
constexpr int kMaxParts = 64;
constexpr int kMaxSteps = 16;
constexpr int kRegisters = 4;
// A step operand that is the previous step's result, still in the kernel's accumulator.
constexpr int8_t kAccumulator = 127;

// How an operand is read: the interpreter and the generated kernels tell the same kinds apart.
using Access = GeneratedOperand::Access;

struct Operand {
  const void* data = nullptr;
  Access access = Access::kFull;
  bool float32 = false;           // stored as float32 (constants; everything in a float32 engine)
  int64_t repeat = 1, count = 1;  // kBlock: offset = (i / repeat) % count
  FastDiv repeat_div, count_div;  // the same, for 32-bit indices
  int64_t last_stride = 0;        // kStrided: the stride of the output's innermost dim
  StridedShape shape;             // kStrided
};

// A step's operand: a register (0 .. kRegisters-1), the accumulator, or an input (-1 - index).
struct Step {
  uint8_t binary = 0;
  uint8_t op = 0;  // ir::ElementwiseBinary or ir::UnaryOp
  int8_t a = 0, b = 0;
  int8_t result = -1;  // the register that keeps the result for later steps, or -1
  float alpha = 0.f, beta = 0.f;
};

struct Concat {
  int parts = 0;
  int64_t row = 0;  // elements of one output row (the concatenated axis and those after it)
  FastDiv row_div;
  const void* data[kMaxParts] = {};
  int64_t width[kMaxParts] = {};      // elements of one row of each part
  int64_t start[kMaxParts + 1] = {};  // where each part's piece starts in an output row
};

struct Program {
  int operands = 0;
  int staged = -1;  // the operand whose vectors are loaded ahead (kFull or kConcat), or -1
  Operand operand[kMaxOperands + 1];  // operand 0 may be the concatenation
  int steps = 0;
  Step step[kMaxSteps];
  Concat concat;
  void* out = nullptr;
  int64_t n = 0;
};

// The concatenation's part table in shared memory: threads of a warp look up different parts,
// which reads of the launch parameters would serialize.
struct PartTable {
  const void* data[kMaxParts];
  int64_t width[kMaxParts];
  int64_t start[kMaxParts + 1];
};

// Every block copies the part table once before its threads look parts up.
__device__ __forceinline__ void load_part_table(const Concat& c, PartTable& table) {
  for (int k = threadIdx.x; k <= c.parts; k += blockDim.x) {
    table.start[k] = c.start[k];
    if (k < c.parts) {
      table.data[k] = c.data[k];
      table.width[k] = c.width[k];
    }
  }
  __syncthreads();
}

template <class I> __device__ __forceinline__ I divide(I n, int64_t d, const FastDiv& f) {
  if constexpr (sizeof(I) == 4) return fast_div(f, n);
  else return n / d;
}

template <int V> __device__ __forceinline__ void load_vector(const void* p, bool float32, int64_t at, float (&v)[V]) {
  if constexpr (V == 1) {
    v[0] = float32 ? static_cast<const float*>(p)[at] : __half2float(static_cast<const __half*>(p)[at]);
  } else if (float32) {
    load_floats<V>(static_cast<const float*>(p) + at, v);
  } else {
    load_floats<V>(static_cast<const __half*>(p) + at, v);
  }
}

__device__ __forceinline__ float load_one(const void* p, bool float32, int64_t at) {
  return float32 ? static_cast<const float*>(p)[at] : __half2float(static_cast<const __half*>(p)[at]);
}

// Where output element i of the concatenation lies: its part (`part`) and the offset there.
template <class I>
__device__ __forceinline__ I concat_offset(const Concat& c, const PartTable& t, I i, const void*& part) {
  const I row = divide<I>(i, c.row, c.row_div), at = i - row * static_cast<I>(c.row);
  int lo = 0, hi = c.parts - 1;  // the last part starting at or before `at`
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (static_cast<I>(t.start[mid]) <= at) lo = mid;
    else hi = mid - 1;
  }
  part = t.data[lo];
  return row * static_cast<I>(t.width[lo]) + (at - static_cast<I>(t.start[lo]));
}

// Operand k's V elements from output element i (a multiple of V). I: the index type (32-bit
// where the output has fewer than 2^31 elements: divisions become a multiply and a shift).
template <int V, class I>
__device__ __forceinline__ void load_operand(const Program& p, const PartTable& t, int k, I i, float (&v)[V]) {
  const Operand& o = p.operand[k];
  switch (o.access) {
    case Access::kFull: load_vector<V>(o.data, o.float32, i, v); return;
    case Access::kBlock: {
      const I q = o.repeat == 1 ? i : divide<I>(i, o.repeat, o.repeat_div);
      const I at = q - divide<I>(q, o.count, o.count_div) * static_cast<I>(o.count);
      if (o.repeat == 1) {
        load_vector<V>(o.data, o.float32, at, v);
        return;
      }
      const float s = load_one(o.data, o.float32, at);  // the V elements share it (repeat % V == 0)
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = s;
      return;
    }
    case Access::kScalar: {
      const float s = load_one(o.data, o.float32, 0);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = s;
      return;
    }
    case Access::kStrided: {
      const int64_t at = strided_offset(o.shape, i);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = load_one(o.data, o.float32, at + j * o.last_stride);
      return;
    }
    case Access::kConcat: {
      const void* part;
      const I at = concat_offset(p.concat, t, i, part);
      load_vector<V>(part, o.float32, at, v);
      return;
    }
  }
}

template <int V> __device__ __forceinline__ void copy(float (&to)[V], const float (&from)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) to[j] = from[j];
}

template <ir::UnaryOp kOp, int V> __device__ __forceinline__ void unary(float (&v)[V], ir::UnaryParams params) {
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = ir::unary_float<kOp>(v[j], params);
}

template <int V> __device__ __forceinline__ void apply_unary(ir::UnaryOp op, ir::UnaryParams params, float (&v)[V]) {
  switch (op) {
#define KILN_FUSED_UNARY(k) \
  case ir::UnaryOp::k: unary<ir::UnaryOp::k, V>(v, params); return;
    KILN_FLOAT_UNARY_OPS(KILN_FUSED_UNARY)
#undef KILN_FUSED_UNARY
    default: return;  // the program accepts only ops with float math
  }
}

template <int V> __device__ __forceinline__ void apply_binary(ir::ElementwiseBinary op, float (&a)[V], const float (&b)[V]) {
  switch (op) {
    case ir::ElementwiseBinary::kAdd:
#pragma unroll
      for (int j = 0; j < V; ++j) a[j] = a[j] + b[j];
      return;
    case ir::ElementwiseBinary::kMul:
#pragma unroll
      for (int j = 0; j < V; ++j) a[j] = a[j] * b[j];
      return;
    default:
#pragma unroll
      for (int j = 0; j < V; ++j) a[j] = ir::elementwise_binary(op, a[j], b[j]);
      return;
  }
}

template <class T, int V> __device__ __forceinline__ void store_vector(T* p, const float (&v)[V]) {
  if constexpr (V == 1) {
    store_float<T>(p, 0, v[0]);
  } else if constexpr (std::is_same_v<T, __half>) {
    store_floats<V>(p, v);
  } else {
#pragma unroll
    for (int k = 0; k < V / 4; ++k)
      reinterpret_cast<float4*>(p)[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
  }
}

// The staged operand's vector: 16 bytes (8 float16 or 4 float32) as loaded.
template <class T, int V> __device__ __forceinline__ void unpack(const uint4& raw, float (&v)[V]) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int k = 0; k < V / 2; ++k) {
      const float2 f = __half22float2(h[k]);
      v[2 * k] = f.x;
      v[2 * k + 1] = f.y;
    }
  } else {
    const float* f = reinterpret_cast<const float*>(&raw);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = f[j];
  }
}

template <class I> __device__ __forceinline__ uint4 load_staged(const Program& p, const PartTable& t, I i) {
  const Operand& o = p.operand[p.staged];
  const void* data = o.data;
  I at = i;
  if (o.access == Access::kConcat) at = concat_offset(p.concat, t, i, data);
  return __ldg(reinterpret_cast<const uint4*>(static_cast<const char*>(data) + static_cast<size_t>(at) * (o.float32 ? 4 : 2)));
}

// Runs the program over the V elements from i; `staged` holds the staged operand's (V > 1). R:
// the registers the program keeps results in (0: every result is read by the next step only).
template <class T, int V, class I, int R>
__device__ __forceinline__ void run_program(const Program& p, const PartTable& t, I i, const uint4& staged) {
  float reg[R > 0 ? R : 1][V];
  float a[V], b[V];
  auto fetch = [&](int src, float (&to)[V]) {
    if constexpr (R > 0) {
      // Registers by constant index only: an indexed array would live in local memory.
      switch (src) {
        case 0: copy<V>(to, reg[0]); return;
        case 1: copy<V>(to, reg[R > 1 ? 1 : 0]); return;
        case 2: copy<V>(to, reg[R > 2 ? 2 : 0]); return;
        case 3: copy<V>(to, reg[R > 3 ? 3 : 0]); return;
        default: break;
      }
    }
    if constexpr (V > 1) {
      if (-1 - src == p.staged) {
        unpack<T, V>(staged, to);
        return;
      }
    }
    load_operand<V, I>(p, t, -1 - src, i, to);
  };
  for (int s = 0; s < p.steps; ++s) {
    const Step& st = p.step[s];
    if (st.b == kAccumulator) {
      copy<V>(b, a);
      if (st.a != kAccumulator) fetch(st.a, a);
    } else {
      if (st.a != kAccumulator) fetch(st.a, a);
      if (st.binary) fetch(st.b, b);
    }
    if (st.binary) apply_binary<V>(static_cast<ir::ElementwiseBinary>(st.op), a, b);
    else apply_unary<V>(static_cast<ir::UnaryOp>(st.op), ir::UnaryParams{st.alpha, st.beta}, a);
    if constexpr (R > 0) {
      switch (st.result) {
        case 0: copy<V>(reg[0], a); break;
        case 1: copy<V>(reg[R > 1 ? 1 : 0], a); break;
        case 2: copy<V>(reg[R > 2 ? 2 : 0], a); break;
        case 3: copy<V>(reg[R > 3 ? 3 : 0], a); break;
        default: break;
      }
    }
  }
  store_vector<T, V>(static_cast<T*>(p.out) + i, a);
}

// Every thread takes kStaged vectors a pass, the grid's width apart (each load coalesced across
// a warp), and loads the staged operand's kStaged vectors before it computes the first, so that
// each thread has several loads in flight while it interprets. Pipelined: it loads the next
// pass's while it computes this one's (16 registers more).
constexpr int kStaged = 4;

template <class T, int V, class I, int R, bool kPipelined>
__global__ void __launch_bounds__(256) fused_elementwise_kernel(const __grid_constant__ Program p) {
  __shared__ PartTable table;
  load_part_table(p.concat, table);
  const I vectors = static_cast<I>(p.n / V);
  const I threads = static_cast<I>(gridDim.x) * blockDim.x;
  const I first = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x;
  auto load_pass = [&](I base, uint4 (&into)[kStaged]) {
    if (p.staged < 0) return;
#pragma unroll
    for (int u = 0; u < kStaged; ++u)
      if (base + u * threads < vectors) into[u] = load_staged(p, table, (base + u * threads) * V);
  };
  if constexpr (V == 1) {
    for (I v = first; v < vectors; v += threads) run_program<T, V, I, R>(p, table, v, uint4{});
  } else if constexpr (kPipelined) {
    uint4 current[kStaged] = {}, next[kStaged] = {};
    if (first < vectors) load_pass(first, current);
    for (I base = first; base < vectors; base += threads * kStaged) {
      if (base + threads * kStaged < vectors) load_pass(base + threads * kStaged, next);
#pragma unroll
      for (int u = 0; u < kStaged; ++u)
        if (base + u * threads < vectors) run_program<T, V, I, R>(p, table, (base + u * threads) * V, current[u]);
#pragma unroll
      for (int u = 0; u < kStaged; ++u) current[u] = next[u];
    }
  } else {
    for (I base = first; base < vectors; base += threads * kStaged) {
      uint4 staged[kStaged] = {};
      if (p.staged >= 0) {
#pragma unroll
        for (int u = 0; u < kStaged; ++u)
          if (base + u * threads < vectors) staged[u] = load_staged(p, table, (base + u * threads) * V);
      }
#pragma unroll
      for (int u = 0; u < kStaged; ++u)
        if (base + u * threads < vectors) run_program<T, V, I, R>(p, table, (base + u * threads) * V, staged[u]);
    }
  }
}

// A chain: a program whose every result is read by the next step only (no registers), run step
// by step over U vectors of each thread at once, so that each step's dispatch and operand
// decoding is paid once per U vectors instead of once per vector. The common groups are chains:
// BatchNorm then an activation, a residual add then an activation, a gate.
template <class T, int V, class I, int U>
__global__ void __launch_bounds__(256) fused_chain_kernel(const __grid_constant__ Program p) {
  constexpr int N = U * V;
  __shared__ PartTable table;
  load_part_table(p.concat, table);
  const I vectors = static_cast<I>(p.n / V);
  const I threads = static_cast<I>(gridDim.x) * blockDim.x;
  for (I base = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; base < vectors; base += threads * U) {
    uint4 staged[U] = {};
    if (p.staged >= 0) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (base + u * threads < vectors) staged[u] = load_staged(p, table, (base + u * threads) * V);
    }
    // The operand `src` (an input) of all U vectors, into v[u * V ...].
    auto fetch = [&](int src, float (&v)[N]) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float part[V];
        const I i = (base + u * threads) * V;
        if (-1 - src == p.staged) unpack<T, V>(staged[u], part);
        else if (base + u * threads < vectors) load_operand<V, I>(p, table, -1 - src, i, part);
        else for (int j = 0; j < V; ++j) part[j] = 0.f;
#pragma unroll
        for (int j = 0; j < V; ++j) v[u * V + j] = part[j];
      }
    };
    float acc[N], other[N];
    for (int s = 0; s < p.steps; ++s) {
      const Step& st = p.step[s];
      if (!st.binary) {
        if (st.a != kAccumulator) fetch(st.a, acc);
        apply_unary<N>(static_cast<ir::UnaryOp>(st.op), ir::UnaryParams{st.alpha, st.beta}, acc);
        continue;
      }
      const ir::ElementwiseBinary op = static_cast<ir::ElementwiseBinary>(st.op);
      if (st.a == kAccumulator && st.b == kAccumulator) {
        copy<N>(other, acc);
        apply_binary<N>(op, acc, other);
      } else if (st.a == kAccumulator) {
        fetch(st.b, other);
        apply_binary<N>(op, acc, other);
      } else if (st.b == kAccumulator) {
        fetch(st.a, other);
        apply_binary<N>(op, other, acc);
        copy<N>(acc, other);
      } else {  // the first step
        fetch(st.a, acc);
        fetch(st.b, other);
        apply_binary<N>(op, acc, other);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + u * threads >= vectors) break;
      float part[V];
#pragma unroll
      for (int j = 0; j < V; ++j) part[j] = acc[u * V + j];
      store_vector<T, V>(static_cast<T*>(p.out) + (base + u * threads) * V, part);
    }
  }
}

// --- host side ------------------------------------------------------------------------------

std::string check_fused(const LayerRequest& r) {
  for (size_t i = 0; i < r.inputs.size(); ++i)
    if (!r.has_input(i) || r.input_dtypes[i] != DType::kFloat32) return "every input must be float32";
  if (r.output_dtypes.at(0) != DType::kFloat32) return "the output must be float32";
  const ir::ElementwiseProgram p = ir::ElementwiseProgram::of(r.node);
  if (p.inputs > kMaxOperands + (p.concat_parts > 0 ? 1 : 0)) return "more than " + std::to_string(kMaxOperands) + " inputs";
  if (p.concat_parts > kMaxParts) return "more than " + std::to_string(kMaxParts) + " concatenated inputs";
  if (static_cast<int>(p.steps.size()) > kMaxSteps) return "more than " + std::to_string(kMaxSteps) + " steps";
  if (p.live_results() > kRegisters) return "more than " + std::to_string(kRegisters) + " results alive at once";
  if (r.output_shapes.at(0).size() > static_cast<size_t>(kMaxKernelRank)) return "rank above " + std::to_string(kMaxKernelRank);
  for (size_t i = 0; i < static_cast<size_t>(p.concat_parts); ++i)
    if (r.is_constant(i)) return "a concatenated input is a constant";
  return "";
}

LayerFormats fused_formats(const LayerRequest& r) {
  const ir::ElementwiseProgram p = ir::ElementwiseProgram::of(r.node);
  const std::vector<int64_t>& out = r.output_shapes.at(0);
  const DType storage = r.float_storage();
  Layout layout = Layout::kLinear;
  if (out.size() == 4) {
    for (size_t i = 0; i < r.inputs.size(); ++i) {
      const bool shaped = i < static_cast<size_t>(p.concat_parts) || r.inputs[i]->shape == out;
      if (!r.is_constant(i) && shaped && r.inputs[i]->format.layout == Layout::kNHWC) layout = Layout::kNHWC;
    }
  }
  LayerFormats f;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    if (r.is_constant(i)) {
      f.inputs.emplace_back();  // uploaded by the layer, as float32
    } else if (i < static_cast<size_t>(p.concat_parts)) {
      f.inputs.push_back(Format{storage, layout});  // parts in the output's layout: rows split
    } else {
      f.inputs.push_back(Format{storage, r.inputs[i]->rank() == 4 ? r.inputs[i]->format.layout : Layout::kLinear});
    }
  }
  f.outputs.push_back(Format{storage, layout});
  return f;
}

// The output's dims in memory order and the logical dim each one is.
std::vector<int> memory_order(size_t rank, Layout layout) {
  if (layout == Layout::kNHWC && rank == 4) return {0, 2, 3, 1};
  std::vector<int> order(rank);
  for (size_t d = 0; d < rank; ++d) order[d] = static_cast<int>(d);
  return order;
}

class FusedElementwiseLayer final : public Layer {
 public:
  FusedElementwiseLayer(const LayerRequest& r, const LayerFormats& f, BuildServices& services)
      : program_(ir::ElementwiseProgram::of(r.node)), half_(f.outputs[0].dtype == DType::kFloat16), name_(r.node.name) {
    const std::vector<int64_t>& out = r.output_shapes.at(0);
    const Layout layout = f.outputs[0].layout;
    const std::vector<int> order = memory_order(out.size(), layout);
    std::vector<int64_t> dims;  // memory order
    for (int d : order) dims.push_back(out[static_cast<size_t>(d)]);
    base_.n = shape_numel(out);
    const int vector = half_ ? 8 : 4;
    vector_ok_ = base_.n % vector == 0;

    // Operand 0: the concatenation.
    size_t first = 0;
    if (program_.concat_parts > 0) {
      const int axis = program_.concat_axis;
      const size_t at = static_cast<size_t>(std::find(order.begin(), order.end(), axis) - order.begin());
      int64_t inner = 1;
      for (size_t k = at + 1; k < dims.size(); ++k) inner *= dims[k];
      Concat& c = base_.concat;
      c.parts = program_.concat_parts;
      c.row = dims[at] * inner;
      int64_t start = 0;
      for (int k = 0; k < c.parts; ++k) {
        c.start[k] = start;
        c.width[k] = r.inputs[static_cast<size_t>(k)]->shape[static_cast<size_t>(axis)] * inner;
        start += c.width[k];
        vector_ok_ = vector_ok_ && c.width[k] % vector == 0;
        runtime_.push_back({0, static_cast<size_t>(k), true});
      }
      c.start[c.parts] = start;
      Operand& o = base_.operand[0];
      o.access = Access::kConcat;
      o.float32 = !half_;
      first = static_cast<size_t>(program_.concat_parts);
      base_.operands = 1;
      GeneratedOperand& g = generated_.operands.emplace_back();
      g.access = Access::kConcat;
      generated_.concat.row = c.row;
      generated_.concat.width.assign(c.width, c.width + c.parts);
    }
    slot_constants_.assign(r.inputs.size(), nullptr);
    for (size_t i = first; i < r.inputs.size(); ++i) {
      Operand& o = base_.operand[base_.operands];
      const TensorSpec& spec = *r.inputs[i];
      std::vector<int64_t> strides;
      GeneratedOperand& g = generated_.operands.emplace_back();
      g.slot = static_cast<int>(i);
      if (r.is_constant(i)) {
        const Tensor& t = *r.constants[i];
        o.data = services.upload(t.raw(), t.nbytes());  // float32, row-major
        o.float32 = true;
        strides = TensorSpec{t.shape(), Format{DType::kFloat32, Layout::kLinear}}.logical_strides();
        slot_constants_[i] = o.data;
        if (t.numel() > 0) g.value = t.data<float>()[0];  // written into the code where it is a scalar
      } else {
        o.float32 = !half_;
        strides = spec.logical_strides();
        runtime_.push_back({base_.operands, i, false});
      }
      // The operand's stride along each output dim, in memory order (0: broadcast).
      const size_t shift = out.size() - spec.shape.size();
      std::vector<int64_t> stride(dims.size(), 0);
      for (size_t k = 0; k < dims.size(); ++k) {
        const size_t d = static_cast<size_t>(order[k]);
        if (d >= shift && spec.shape[d - shift] != 1) stride[k] = strides[d - shift];
        if (dims[k] == 1) stride[k] = 0;
      }
      classify(o, dims, stride, vector);
      g.access = o.access;
      g.float32 = o.float32;
      g.repeat = o.repeat;
      g.count = o.count;
      if (o.access != Access::kScalar) g.value.reset();
      for (size_t k = 0; k < dims.size(); ++k)
        if (dims[k] > 1) g.dims.emplace_back(dims[k], stride[k]);
      ++base_.operands;
    }
    // The operand loaded ahead: the concatenation, else the first input read as the output is.
    for (int k = 0; k < base_.operands && base_.staged < 0; ++k) {
      const Operand& o = base_.operand[k];
      if ((o.access == Access::kConcat || o.access == Access::kFull) && o.float32 == !half_ &&
          std::any_of(runtime_.begin(), runtime_.end(), [&](const RuntimeInput& in) { return in.operand == k; }))
        base_.staged = k;
    }
    // Results: one read only by the next step stays in the kernel's accumulator; one read later
    // takes a register freed by then. The last step's is the output.
    const int n = static_cast<int>(program_.steps.size());
    std::vector<int> last_use(static_cast<size_t>(n), -1), held(static_cast<size_t>(n), -1);
    for (int s = 0; s < n; ++s)
      for (int v : {program_.steps[static_cast<size_t>(s)].a, program_.steps[static_cast<size_t>(s)].b})
        if (v >= program_.inputs) last_use[static_cast<size_t>(v - program_.inputs)] = s;
    bool busy[kRegisters] = {};
    auto source = [&](int v, int s) -> int8_t {
      if (v < program_.inputs) return static_cast<int8_t>(-1 - v);
      if (v - program_.inputs == s - 1) return kAccumulator;
      return static_cast<int8_t>(held[static_cast<size_t>(v - program_.inputs)]);
    };
    for (int s = 0; s < n; ++s) {
      const ir::ElementwiseStep& st = program_.steps[static_cast<size_t>(s)];
      Step& k = base_.step[s];
      k.binary = st.binary;
      k.op = st.binary ? static_cast<uint8_t>(st.binary_op) : static_cast<uint8_t>(st.unary_op);
      k.a = source(st.a, s);
      k.b = st.binary ? source(st.b, s) : 0;
      k.alpha = st.params.alpha;
      k.beta = st.params.beta;
      for (int v : {st.a, st.b})
        if (v >= program_.inputs && last_use[static_cast<size_t>(v - program_.inputs)] == s &&
            held[static_cast<size_t>(v - program_.inputs)] >= 0)
          busy[held[static_cast<size_t>(v - program_.inputs)]] = false;
      k.result = -1;
      if (last_use[static_cast<size_t>(s)] > s + 1) {
        const int free = static_cast<int>(std::find(busy, busy + kRegisters, false) - busy);
        if (free == kRegisters) throw r.node.error(ErrorKind::kInternal, "a fused elementwise group needs more registers");
        busy[free] = true;
        held[static_cast<size_t>(s)] = free;
        k.result = static_cast<int8_t>(free);
        registers_ = std::max(registers_, free + 1);
      }
    }
    base_.steps = n;
    sms_ = services.device().multiProcessorCount;
    signature_ = vector_ok_ ? (half_ ? "v8" : "v4") : "v1";
    if (registers_) signature_ += std::string("r") + std::to_string(kRegisters);
    signature_ += '(';
    if (program_.concat_parts > 0) signature_ += std::string("Concat ") + std::to_string(program_.concat_parts) + "+";
    for (size_t s = 0; s < program_.steps.size(); ++s) {
      if (s) signature_ += '+';
      signature_ += ir::elementwise_op_name(program_.steps[s]);
    }
    signature_ += ")";
    generated_.half = half_;
    generated_.n = base_.n;
    generated_.slots = static_cast<int>(r.inputs.size());
    generated_.signature = signature_;
    choose_kernel(services);
  }

  void enqueue(const LayerIO& io, cudaStream_t stream) const override {
    if (base_.n == 0) return;
    bool aligned = false;
    const Program p = bind(io, aligned);
    launch(aligned ? kernel_ : Kernel::kInterpreter, p, io, aligned, stream);
  }

  std::string tactic() const override { return "kernel:fused_elementwise/" + std::string(kKernelNames[static_cast<int>(kernel_)]) + "/" + signature_; }

 private:
  // The kernels a group may run on: the interpreter (any program), a chain's kernel taking 2 or
  // 4 vectors per thread a step (programs without registers, whose operands allow vectors), or
  // the group's own generated kernel taking 1, 2 or 4 vectors per thread a pass (programs whose
  // operands allow vectors; fused_elementwise_source.h).
  enum class Kernel : uint8_t { kInterpreter, kPipelined, kChain2, kChain4, kGenerated1, kGenerated2, kGenerated4 };
  static constexpr int kKernels = 7;
  static constexpr const char* kKernelNames[kKernels] = {"interpreter", "pipelined", "chain2", "chain4",
                                                         "generated1", "generated2", "generated4"};
  static constexpr int kFirstGenerated = static_cast<int>(Kernel::kGenerated1);
  static bool is_chain(Kernel k) { return k == Kernel::kChain2 || k == Kernel::kChain4; }
  static bool is_generated(Kernel k) { return static_cast<int>(k) >= kFirstGenerated; }

  // The program with this run's addresses; `aligned`: every address allows 16-byte vectors.
  Program bind(const LayerIO& io, bool& aligned) const {
    Program p = base_;
    aligned = vector_ok_;
    constexpr uintptr_t unit = 16;  // a vector: 8 float16 or 4 float32
    for (const RuntimeInput& in : runtime_) {
      const void* data = io.inputs[in.input];
      if (in.part) p.concat.data[in.input] = data;
      else p.operand[in.operand].data = data;
      aligned = aligned && reinterpret_cast<uintptr_t>(data) % unit == 0;
    }
    p.out = io.outputs[0];
    aligned = aligned && reinterpret_cast<uintptr_t>(p.out) % unit == 0;
    if (p.n < (int64_t{1} << 31)) set_divisors(p);
    return p;
  }

  void launch(Kernel kernel, const Program& p, const LayerIO& io, bool aligned, cudaStream_t stream) const {
    if (is_generated(kernel)) {
      // The kernel's one parameter: the addresses of the node's inputs (constants: where they
      // were uploaded), then the output's.
      const void* args[kMaxParts + kMaxOperands + 1] = {};
      const size_t slots = slot_constants_.size();
      for (size_t i = 0; i < slots; ++i) args[i] = slot_constants_[i] ? slot_constants_[i] : io.inputs[i];
      args[std::max<size_t>(slots, 1)] = io.outputs[0];
      const int unroll = kGeneratedUnrolls[static_cast<int>(kernel) - kFirstGenerated];
      const int64_t vectors = p.n / (half_ ? 8 : 4);
      const int64_t blocks = (vectors + int64_t{256} * unroll - 1) / (int64_t{256} * unroll);
      void* params[] = {args};
      KILN_CUDA_CHECK(cudaLaunchKernel(generated_kernels_[static_cast<int>(kernel) - kFirstGenerated], dim3(capped_blocks(blocks)),
                                       dim3(256), params, 0, stream));
      return;
    }
    const bool narrow = p.n < (int64_t{1} << 31);
    // `per_thread` vectors per thread where the grid still fills the GPU several times over;
    // one per thread for small tensors (a batch-1 layer), which would otherwise run on a few
    // multiprocessors.
    auto start = [&](auto function, int vector, int per_thread) {
      const int64_t vectors = p.n / vector;
      int64_t blocks = (vectors + 255) / 256;
      if (blocks > int64_t{4} * sms_) blocks = (vectors + int64_t{256} * per_thread - 1) / (int64_t{256} * per_thread);
      function<<<capped_blocks(blocks), 256, 0, stream>>>(p);
      KILN_CUDA_CHECK(cudaGetLastError());
    };
    // Instantiations: storage x vector width x index width x kernel.
    auto with_kernel = [&](auto storage, auto vector, auto index) {
      using T = decltype(storage);
      using I = decltype(index);
      constexpr int V = decltype(vector)::value;
      if constexpr (V > 1) {
        if (kernel == Kernel::kChain2) return start(fused_chain_kernel<T, V, I, 2>, V, 2);
        if (kernel == Kernel::kChain4) return start(fused_chain_kernel<T, V, I, 4>, V, 4);
      }
      if constexpr (V > 1) {
        if (kernel == Kernel::kPipelined) {
          if (registers_ > 0) return start(fused_elementwise_kernel<T, V, I, kRegisters, true>, V, kStaged);
          return start(fused_elementwise_kernel<T, V, I, 0, true>, V, kStaged);
        }
      }
      if (registers_ > 0) start(fused_elementwise_kernel<T, V, I, kRegisters, false>, V, kStaged);
      else start(fused_elementwise_kernel<T, V, I, 0, false>, V, kStaged);
    };
    auto with_index = [&](auto storage, auto vector) {
      if (narrow) with_kernel(storage, vector, uint32_t{});
      else with_kernel(storage, vector, int64_t{});
    };
    if (half_) {
      if (aligned) with_index(__half{}, std::integral_constant<int, 8>{});
      else with_index(__half{}, std::integral_constant<int, 1>{});
    } else {
      if (aligned) with_index(float{}, std::integral_constant<int, 4>{});
      else with_index(float{}, std::integral_constant<int, 1>{});
    }
  }

  // A group times its kernels on this GPU (the timing cache keeps the choice): the interpreter
  // with and without pipelining, for a chain the chain's kernels, and the group's generated
  // kernels. Each candidate's output must equal the interpreter's bit for bit: they compute the
  // same operations in the same order, so a difference is a fault in one of them, and the
  // candidate is refused. A group whose generated kernels compile on a worker thread times its
  // candidates once every node is lowered (BuildServices::finish_later).
  void choose_kernel(BuildServices& services) {
    kernel_ = Kernel::kInterpreter;
    if (!vector_ok_ || base_.n == 0) return;
    tactic_key_ = "fused_elementwise|" + storage_name() + "|n" + std::to_string(base_.n) + "|" + signature_ + "|";
    for (int k = 0; k < base_.operands; ++k)
      tactic_key_ += std::to_string(static_cast<int>(base_.operand[k].access)) + (k + 1 < base_.operands ? "," : "");
    if (take_cached(services, true)) return;
    if (!request_generated(services)) return time_candidates(services, false);
    if (cubin_) return time_candidates(services, true);
    // A group of the same key that finished before this one has chosen for it.
    services.finish_later([this](BuildServices& s) {
      if (!take_cached(s, false)) time_candidates(s, generated_ready(s));
    });
  }

  // Takes the tactic the timing cache (or a plan at other shapes) names for this group; false
  // where there is none, or it is a generated kernel the group cannot have. A generated kernel
  // still compiling is waited for once every node is lowered, or now where `may_defer` is false.
  bool take_cached(BuildServices& services, bool may_defer) {
    std::optional<std::string> cached = services.cached_tactic(tactic_key_);
    if (!cached) return false;
    for (int k = 0; k < kKernels; ++k) {
      const Kernel kernel = static_cast<Kernel>(k);
      if (*cached != kKernelNames[k] || (registers_ > 0 && is_chain(kernel))) continue;
      if (!is_generated(kernel)) {
        kernel_ = kernel;
        return true;
      }
      if (!request_generated(services)) return false;  // time the others instead
      auto take = [this, kernel](BuildServices& s) {
        if (!generated_ready(s)) return time_candidates(s, false);
        if (!compiled_.first.empty()) s.record_code(compiled_.first, compiled_.second);
        kernel_ = kernel;
      };
      if (cubin_ || !may_defer) take(services);
      else services.finish_later(take);
      return true;
    }
    return false;
  }

  // Times the candidates on the scratch tensors, checking each against the interpreter on the
  // device, and records the fastest.
  void time_candidates(BuildServices& services, bool generated) {
    const LayerIO& io = services.scratch_io();
    bool aligned = false;
    const Program p = bind(io, aligned);
    if (!aligned) return;
    const int element = half_ ? 2 : 4;
    const size_t bytes = static_cast<size_t>(base_.n) * static_cast<size_t>(element);
    // The interpreter's output, then the comparison's counters (8-byte aligned).
    char* reference = static_cast<char*>(services.scratch((bytes + 255) / 256 * 256 + kBitwiseDifferenceScratch));
    void* counters = reference + (bytes + 255) / 256 * 256;
    cudaStream_t stream = services.stream();
    float best = 1e30f;
    for (int k = 0; k < kKernels; ++k) {
      const Kernel kernel = static_cast<Kernel>(k);
      if ((registers_ > 0 && is_chain(kernel)) || (is_generated(kernel) && !generated)) continue;  // chains hold no registers
      KILN_CUDA_CHECK(cudaMemsetAsync(io.outputs[0], 0xff, bytes, stream));
      launch(kernel, p, io, true, stream);
      if (k == 0) {
        KILN_CUDA_CHECK(cudaMemcpyAsync(reference, io.outputs[0], bytes, cudaMemcpyDeviceToDevice, stream));
      } else if (const BitwiseDifference d = bitwise_difference(reference, io.outputs[0], base_.n, element, counters, stream);
                 d.count > 0) {
        services.log(name_ + ": fused_elementwise/" + kKernelNames[k] + " differs from the interpreter (" + describe(d) +
                     "): refused");
        continue;
      }
      const float ms = services.time_ms([&](cudaStream_t st) { launch(kernel, p, io, true, st); });
      if (services.tactics().log_candidates)
        services.log(name_ + ": fused_elementwise/" + kKernelNames[k] + " " + std::to_string(ms) + " ms");
      if (ms < best) best = ms, kernel_ = kernel;
    }
    // The engine file (and the timing cache) keeps the cubin only of a kernel the group runs.
    if (is_generated(kernel_) && !compiled_.first.empty()) services.record_code(compiled_.first, compiled_.second);
    services.record_tactic(tactic_key_, kKernelNames[static_cast<int>(kernel_)]);
  }

  // Asks for the group's generated kernels: loaded now from the cubin the timing cache or the
  // engine file keeps for its source, else compiling on a worker thread (`compiling_`); false,
  // with the reason in the build log, where the group has none (generated kernels off, a
  // concatenation too finely split, a cubin that does not load).
  bool request_generated(BuildServices& services) {
    if (cubin_ || compiling_.valid()) return true;
    if (!services.tactics().generated_kernels) return false;
    const std::optional<std::string> source = fused_elementwise_source(program_, generated_);
    if (!source) return false;
    const cudaDeviceProp& device = services.device();
    code_key_ = "fused_elementwise_cubin|sm_" + std::to_string(device.major) + std::to_string(device.minor) + "|nvrtc " +
                runtime_compiler_version() + "|" + source_hash(*source);
    if (std::optional<std::string> code = services.cached_code(code_key_)) {
      try {
        load(base64_decode(*code));
        return true;
      } catch (const Error& e) {
        services.log(name_ + ": the cached generated kernel does not load (" + e.what() + "): compiling it again");
      }
    }
    compiling_ = services.compile(*source, name_);
    return true;
  }

  // Whether the generated kernels are loaded, waiting for their compile if need be (`compiled_`
  // then holds the cubin's cache key and code, for the cache if the group keeps it).
  bool generated_ready(BuildServices& services) {
    if (cubin_) return true;
    try {
      const std::string cubin = compiling_.get();
      compiling_ = {};
      load(cubin);
      compiled_ = {code_key_, base64_encode(cubin)};
    } catch (const Error& e) {
      compiling_ = {};
      services.log(name_ + ": no generated kernel: " + e.what());
      return false;
    }
    return true;
  }

  void load(const std::string& cubin) {
    try {
      cubin_ = std::make_unique<LoadedCubin>(cubin);
      for (size_t k = 0; k < std::size(kGeneratedUnrolls); ++k)
        generated_kernels_[k] = cubin_->kernel(generated_kernel_name(kGeneratedUnrolls[k]).c_str());
    } catch (...) {
      cubin_.reset();
      throw;
    }
  }

  // A difference from the interpreter: how many elements, and the first one's bits in each.
  std::string describe(const BitwiseDifference& d) const {
    const int digits = half_ ? 4 : 8;
    auto bits = [&](uint32_t b) {
      char text[16];
      std::snprintf(text, sizeof text, "0x%0*x", digits, b);
      return std::string(text);
    };
    return std::to_string(d.count) + " of " + std::to_string(base_.n) + " elements, the first at " + std::to_string(d.first) +
           ": " + bits(d.got) + " where the interpreter has " + bits(d.want);
  }

  std::string storage_name() const { return half_ ? "float16" : "float32"; }


  // How operand `o` is read, from its stride along each output dim (memory order).
  void classify(Operand& o, const std::vector<int64_t>& dims, const std::vector<int64_t>& stride, int vector) {
    const size_t rank = dims.size();
    // The dims the operand walks (size > 1, stride > 0): one run [lo, hi) read contiguously, as
    // the output is, makes a block; anything else is read through strides.
    size_t lo = rank, hi = 0;
    for (size_t k = 0; k < rank; ++k)
      if (dims[k] > 1 && stride[k] != 0) lo = std::min(lo, k), hi = k + 1;
    if (lo >= hi) {
      o.access = Access::kScalar;
      return;
    }
    bool block = true;
    int64_t walked = 1;
    for (size_t k = hi; k-- > lo;) {
      if (dims[k] > 1) block = block && stride[k] == walked;
      walked *= dims[k];
    }
    if (block) {
      o.repeat = 1;
      for (size_t k = hi; k < rank; ++k) o.repeat *= dims[k];
      o.count = walked;
      if (o.repeat == 1 && o.count == base_.n) {
        o.access = Access::kFull;
        return;
      }
      o.access = Access::kBlock;
      vector_ok_ = vector_ok_ && (o.repeat == 1 ? o.count % vector == 0 : o.repeat % vector == 0);
      return;
    }
    o.access = Access::kStrided;
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (size_t k = 0; k < rank; ++k) merged.emplace_back(dims[k], stride[k]);
    if (!merge_dims(merged, o.shape)) throw Error(ErrorKind::kInternal, "a fused operand has too many dims");
    o.last_stride = rank ? stride.back() : 0;
    vector_ok_ = vector_ok_ && (rank ? dims.back() : 1) % vector == 0;
  }

  struct RuntimeInput {
    int operand;   // in Program::operand
    size_t input;  // in LayerIO::inputs (a part: also its index in Concat::data)
    bool part;
  };

  // The 32-bit divisors of a launch whose indices fit in 32 bits.
  static void set_divisors(Program& p) {
    for (int k = 0; k < p.operands; ++k) {
      Operand& o = p.operand[k];
      if (o.access != Access::kBlock) continue;
      o.repeat_div = make_fast_div(static_cast<uint32_t>(o.repeat));
      o.count_div = make_fast_div(static_cast<uint32_t>(o.count));
    }
    if (p.concat.parts > 0) p.concat.row_div = make_fast_div(static_cast<uint32_t>(p.concat.row));
  }

  ir::ElementwiseProgram program_;
  bool half_;
  std::string name_;  // the node's, for the build log
  GeneratedElementwise generated_;
  std::vector<const void*> slot_constants_;  // per node input: its uploaded address (a constant) or null
  std::string tactic_key_;  // the group's timing-cache entry
  std::string code_key_;    // its generated kernels' cubin's
  std::shared_future<std::string> compiling_;  // their cubin, while it compiles
  std::unique_ptr<LoadedCubin> cubin_;
  std::pair<std::string, std::string> compiled_;  // the cache key and code of a cubin compiled by this build
  const void* generated_kernels_[std::size(kGeneratedUnrolls)] = {};
  Kernel kernel_ = Kernel::kInterpreter;
  int sms_ = 1;
  std::string signature_;  // vector width, registers, ops
  int registers_ = 0;  // registers the program keeps results in
  bool vector_ok_ = true;
  Program base_;
  std::vector<RuntimeInput> runtime_;
};

}  // namespace

KILN_REGISTER_CUDA_LAYERS(fused_elementwise) {
  LayerEntry e;
  e.op = "FusedElementwise";
  e.domain = "kiln";
  e.check = check_fused;
  e.formats = fused_formats;
  e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices& services) -> std::unique_ptr<Layer> {
    return std::make_unique<FusedElementwiseLayer>(r, f, services);
  };
  e.dtypes = "float32, float16";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
