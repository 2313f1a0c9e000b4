// CUDA layers of the data-movement family: Transpose, Concat, Split, Slice, Expand, Tile, Pad,
// DepthToSpace, SpaceToDepth, Trilu, EyeLike, Range, ConstantOfShape, OneHot (and NonZero,
// refused: its output length depends on the data).
//
// Everything moves elements by size (1/2/4/8 bytes), so one kernel serves every dtype; under
// Precision::kFp16 float32 tensors simply move as float16. Most ops are one "strided copy":
// the output written in its memory order, each element read from the input at an offset
// that is a linear function of the output coordinates (Transpose, Slice with any steps,
// Expand and Tile with zero strides, DepthToSpace/SpaceToDepth as 6-D transposes). The host
// simplifies that walk (drops size-1 dims, merges dims contiguous in the source), then picks
// a kernel: a plain memcpy, a 32x32 shared-memory tile transpose when the source is
// contiguous along another dim than the output's innermost, or the generic kernel, widened
// to 4/8/16-byte units when the innermost run is contiguous and aligned. Inputs are indexed
// through their logical strides, so they may be stored kNHWC; Slice and Pad also write
// kNHWC when they read it, Concat and Split work on kNHWC along any axis.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "cuda/runtime/engine.h"
#include "ops/slice_params.h"

namespace kiln::ir {
std::vector<int64_t> full_pads(const Node& node, int64_t rank, const std::vector<int64_t>& pads,
                               const std::optional<std::vector<int64_t>>& axes);
}

namespace kiln::cuda {

namespace {

constexpr int kBlock = 256;

// --- formats --------------------------------------------------------------------------------

bool stored_nhwc(const LayerRequest& r, size_t i) {
  return r.has_input(i) && !r.is_constant(i) && r.inputs[i]->rank() == 4 &&
         r.inputs[i]->format.layout == Layout::kNHWC;
}

// A data input read on the device: its storage dtype, kNHWC kept where `nhwc_ok` and it is
// stored so (constants are uploaded kLinear).
Format data_format(const LayerRequest& r, size_t i, bool nhwc_ok = false) {
  if (!r.has_input(i)) return {};
  return Format{r.storage_of(r.input_dtypes[i]), nhwc_ok && stored_nhwc(r, i) ? Layout::kNHWC : Layout::kLinear};
}

// An input whose value the layer never reads (its effect is in the output shape): constants
// are not uploaded, runtime tensors are taken as they are stored (no reformat).
Format unused_format(const LayerRequest& r, size_t i) {
  if (!r.has_input(i) || r.is_constant(i)) return {};
  return r.inputs[i]->format;
}

// A small parameter read on the device (Trilu's k, Range's start/delta, Pad's value, ...):
// uploaded if constant, in `dtype`.
Format param_format(const LayerRequest& r, size_t i, DType dtype) {
  if (!r.has_input(i)) return {};
  return Format{dtype, Layout::kLinear};
}

std::string storable(DType d) {
  if (element_size(d) == 0) return to_string(d) + " tensors are not supported";
  return "";
}

// --- the strided copy -----------------------------------------------------------------------

// An output walked in memory order: dims, and per dim the element stride of the input.
struct Walk {
  std::vector<int64_t> dims, strides;
  int64_t offset = 0;  // input element offset of output element 0
};

// Drops size-1 dims and merges neighbours contiguous in the source.
Walk simplify(const Walk& w) {
  Walk s;
  s.offset = w.offset;
  for (size_t i = 0; i < w.dims.size(); ++i) {
    if (w.dims[i] == 1) continue;
    if (!s.dims.empty() && s.strides.back() == w.strides[i] * w.dims[i]) {
      s.dims.back() *= w.dims[i];
      s.strides.back() = w.strides[i];
      continue;
    }
    s.dims.push_back(w.dims[i]);
    s.strides.push_back(w.strides[i]);
  }
  return s;
}

// Orders a walk given in logical output dims into the memory order of `layout`.
Walk to_memory_order(Walk w, Layout layout) {
  if (layout == Layout::kNHWC && w.dims.size() == 4) {
    w.dims = {w.dims[0], w.dims[2], w.dims[3], w.dims[1]};
    w.strides = {w.strides[0], w.strides[2], w.strides[3], w.strides[1]};
  }
  return w;
}

struct CopyParams {
  int rank = 0;
  int64_t n = 0;
  int64_t offset = 0;
  int64_t dims[kMaxKernelRank] = {};
  int64_t strides[kMaxKernelRank] = {};
};

template <class U, class I>
__global__ void strided_copy_kernel(const U* __restrict__ src, U* __restrict__ dst, CopyParams p) {
  const I n = static_cast<I>(p.n);
  const I step = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    I rem = i, off = static_cast<I>(p.offset);
#pragma unroll
    for (int d = kMaxKernelRank - 1; d >= 0; --d) {
      if (d >= p.rank) continue;
      const I dim = static_cast<I>(p.dims[d]);
      const I q = rem / dim;
      off += (rem - q * dim) * static_cast<I>(p.strides[d]);
      rem = q;
    }
    dst[i] = src[off];
  }
}

// A transpose in 32x32 tiles: the source is contiguous along dim A, the output along dim B;
// the other dims are a batch with their own source and output strides.
struct TileParams {
  int64_t a = 0, b = 0;            // tile dims
  int64_t src_b = 0, dst_a = 0;    // source stride of B, output stride of A (the others are 1)
  int64_t offset = 0;
  int64_t tiles_b = 0;
  int batch_rank = 0;
  int64_t batch = 1;
  int64_t batch_dims[kMaxKernelRank] = {};
  int64_t batch_src[kMaxKernelRank] = {};
  int64_t batch_dst[kMaxKernelRank] = {};
};

template <class U>
__global__ void tile_transpose_kernel(const U* __restrict__ src, U* __restrict__ dst, TileParams p) {
  __shared__ U tile[32][33];
  const int64_t a0 = static_cast<int64_t>(blockIdx.x / p.tiles_b) * 32;
  const int64_t b0 = static_cast<int64_t>(blockIdx.x % p.tiles_b) * 32;
  for (int64_t bt = blockIdx.y; bt < p.batch; bt += gridDim.y) {
    int64_t rem = bt, s = p.offset, d = 0;
    for (int k = p.batch_rank - 1; k >= 0; --k) {
      const int64_t idx = rem % p.batch_dims[k];
      rem /= p.batch_dims[k];
      s += idx * p.batch_src[k];
      d += idx * p.batch_dst[k];
    }
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
      const int64_t a = a0 + threadIdx.x, b = b0 + i;
      if (a < p.a && b < p.b) tile[i][threadIdx.x] = src[s + a + b * p.src_b];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
      const int64_t a = a0 + i, b = b0 + threadIdx.x;
      if (a < p.a && b < p.b) dst[d + a * p.dst_a + b] = tile[threadIdx.x][i];
    }
    __syncthreads();
  }
}

enum class CopyKind { kNone, kMemcpy, kTile, kGeneric };

struct CopyPlan {
  CopyKind kind = CopyKind::kNone;
  size_t es = 0;
  CopyParams generic;  // in elements of es bytes
  size_t max_unit = 0; // the widest unit the generic walk allows (before pointer alignment)
  TileParams tile;
  int64_t bytes = 0;   // kMemcpy
};

// The rank a walk needs after simplification (for check()).
size_t walk_rank(const Walk& w) { return simplify(w).dims.size(); }

CopyPlan plan_copy(const Walk& logical_walk, size_t es) {
  CopyPlan plan;
  plan.es = es;
  int64_t n = 1;
  for (int64_t d : logical_walk.dims) n *= d;
  if (n == 0) return plan;
  Walk w = simplify(logical_walk);
  const size_t rank = w.dims.size();
  if (rank > static_cast<size_t>(kMaxKernelRank))
    throw Error(ErrorKind::kUnsupported, "the copy needs " + std::to_string(rank) + " dims after merging (at most " +
                                             std::to_string(kMaxKernelRank) + ")");
  if (rank == 0 || (rank == 1 && w.strides[0] == 1)) {
    plan.kind = CopyKind::kMemcpy;
    plan.bytes = n * static_cast<int64_t>(es);
    plan.generic.offset = w.offset;
    return plan;
  }
  // Tiles when the source is contiguous along a dim other than the last, and both are long
  // enough to fill a tile reasonably.
  int tile_axis = -1;
  if (w.strides.back() != 1)
    for (size_t j = 0; j + 1 < rank; ++j)
      if (w.strides[j] == 1) tile_axis = static_cast<int>(j);
  if (tile_axis >= 0 && w.dims[static_cast<size_t>(tile_axis)] >= 16 && w.dims.back() >= 16) {
    plan.kind = CopyKind::kTile;
    TileParams& t = plan.tile;
    std::vector<int64_t> dst_strides(rank, 1);
    for (size_t j = rank - 1; j-- > 0;) dst_strides[j] = dst_strides[j + 1] * w.dims[j + 1];
    const size_t ta = static_cast<size_t>(tile_axis);
    t.a = w.dims[ta];
    t.b = w.dims.back();
    t.src_b = w.strides.back();
    t.dst_a = dst_strides[ta];
    t.offset = w.offset;
    t.tiles_b = (t.b + 31) / 32;
    for (size_t j = 0; j + 1 < rank; ++j) {
      if (j == ta) continue;
      t.batch_dims[t.batch_rank] = w.dims[j];
      t.batch_src[t.batch_rank] = w.strides[j];
      t.batch_dst[t.batch_rank] = dst_strides[j];
      t.batch *= w.dims[j];
      ++t.batch_rank;
    }
    return plan;
  }
  plan.kind = CopyKind::kGeneric;
  CopyParams& p = plan.generic;
  p.rank = static_cast<int>(rank);
  p.n = n;
  p.offset = w.offset;
  for (size_t j = 0; j < rank; ++j) {
    p.dims[j] = w.dims[j];
    p.strides[j] = w.strides[j];
  }
  plan.max_unit = es;
  if (w.strides.back() == 1) {
    const uint64_t ues = es;
    uint64_t acc = static_cast<uint64_t>(w.dims.back()) * ues | static_cast<uint64_t>(w.offset < 0 ? -w.offset : w.offset) * ues;
    for (size_t j = 0; j + 1 < rank; ++j)
      acc |= static_cast<uint64_t>(w.strides[j] < 0 ? -w.strides[j] : w.strides[j]) * ues;
    plan.max_unit = widest_unit(es, {acc});
  }
  return plan;
}

// The largest element offset a generic walk reaches (for choosing 32-bit indexing).
int64_t reach(const CopyParams& p) {
  int64_t hi = std::abs(p.offset);
  for (int j = 0; j < p.rank; ++j) hi += (p.dims[j] - 1) * std::abs(p.strides[j]);
  return hi;
}

void run_copy(const CopyPlan& plan, const void* src, void* dst, cudaStream_t stream) {
  const size_t es = plan.es;
  switch (plan.kind) {
    case CopyKind::kNone: return;
    case CopyKind::kMemcpy:
      KILN_CUDA_CHECK(cudaMemcpyAsync(dst, static_cast<const char*>(src) + plan.generic.offset * static_cast<int64_t>(es),
                                      static_cast<size_t>(plan.bytes), cudaMemcpyDeviceToDevice, stream));
      return;
    case CopyKind::kTile: {
      const TileParams& t = plan.tile;
      const int64_t tiles = ((t.a + 31) / 32) * t.tiles_b;
      dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles, (int64_t{1} << 31) - 1)),
                static_cast<unsigned>(std::min<int64_t>(t.batch, 65535)));
      with_unit(es, [&](auto tag) {
        using U = decltype(tag);
        tile_transpose_kernel<U><<<grid, dim3(32, 8), 0, stream>>>(static_cast<const U*>(src), static_cast<U*>(dst), t);
        KILN_CUDA_CHECK_LAUNCH();
      });
      return;
    }
    case CopyKind::kGeneric: {
      CopyParams p = plan.generic;
      const size_t unit = std::max(es, pointer_unit(plan.max_unit, src, dst));
      if (unit > es) {
        const int64_t f = static_cast<int64_t>(unit / es);
        p.dims[p.rank - 1] /= f;
        p.n /= f;
        p.offset /= f;
        for (int j = 0; j + 1 < p.rank; ++j) p.strides[j] /= f;
      }
      const bool small = p.n <= (int64_t{1} << 30) && reach(p) <= (int64_t{1} << 30);
      with_unit(unit, [&](auto tag) {
        using U = decltype(tag);
        if (small)
          strided_copy_kernel<U, int32_t><<<grid_for(p.n, kBlock, 4), kBlock, 0, stream>>>(static_cast<const U*>(src),
                                                                                          static_cast<U*>(dst), p);
        else
          strided_copy_kernel<U, int64_t><<<grid_for(p.n, kBlock, 4), kBlock, 0, stream>>>(static_cast<const U*>(src),
                                                                                          static_cast<U*>(dst), p);
        KILN_CUDA_CHECK_LAUNCH();
      });
      return;
    }
  }
}

std::string copy_tactic(const CopyPlan& plan) {
  switch (plan.kind) {
    case CopyKind::kNone: return "kernel:copy(empty)";
    case CopyKind::kMemcpy: return "memcpy";
    case CopyKind::kTile: return "kernel:tile_transpose";
    case CopyKind::kGeneric: return "kernel:strided_copy";
  }
  return "?";
}

std::unique_ptr<Layer> copy_layer(const Walk& walk, size_t es) {
  CopyPlan plan = plan_copy(walk, es);
  return make_layer(copy_tactic(plan), [plan](const LayerIO& io, cudaStream_t stream) {
    run_copy(plan, io.inputs[0], io.outputs[0], stream);
  });
}

// Rank check shared by the strided-copy ops.
std::string walk_reason(const Walk& w) {
  size_t rank = walk_rank(w);
  if (rank > static_cast<size_t>(kMaxKernelRank))
    return "the copy needs " + std::to_string(rank) + " dims after merging (the CUDA kernels take at most " +
           std::to_string(kMaxKernelRank) + ")";
  return "";
}

// --- per-op walks ----------------------------------------------------------------------------

std::vector<int64_t> transpose_perm(const LayerRequest& r) {
  std::vector<int64_t> perm = r.node.attrs.get_ints("perm");
  if (perm.empty())
    for (int i = r.inputs[0]->rank(); i-- > 0;) perm.push_back(i);
  return perm;
}

Walk transpose_walk(const LayerRequest& r) {
  const TensorSpec& in = *r.inputs[0];
  std::vector<int64_t> strides = in.logical_strides();
  std::vector<int64_t> perm = transpose_perm(r);
  Walk w;
  for (int64_t p : perm) {
    w.dims.push_back(in.shape.at(static_cast<size_t>(p)));
    w.strides.push_back(strides.at(static_cast<size_t>(p)));
  }
  return w;
}

// DepthToSpace / SpaceToDepth: the output (kLinear) as a 6-D view read from a 6-D view of the
// input (split channels or split spatial dims), as the CPU kernel's transposes.
Walk depth_space_walk(const LayerRequest& r) {
  const TensorSpec& in = *r.inputs[0];
  const std::vector<int64_t> st = in.logical_strides();
  const int64_t n = in.shape[0], c = in.shape[1], h = in.shape[2], w = in.shape[3];
  const int64_t sn = st[0], sc = st[1], sh = st[2], sw = st[3];
  const bool to_space = r.node.op == "DepthToSpace";
  const bool crd = r.node.attrs.get_string("mode", "DCR") == "CRD";
  const int64_t b = r.node.attrs.require_int("blocksize");
  std::vector<int64_t> view, vs, perm;
  if (to_space && crd) {
    const int64_t cc = c / (b * b);
    view = {n, cc, b, b, h, w};
    vs = {sn, b * b * sc, b * sc, sc, sh, sw};
    perm = {0, 1, 4, 2, 5, 3};
  } else if (to_space) {
    const int64_t cc = c / (b * b);
    view = {n, b, b, cc, h, w};
    vs = {sn, b * cc * sc, cc * sc, sc, sh, sw};
    perm = {0, 3, 4, 1, 5, 2};
  } else {
    view = {n, c, h / b, b, w / b, b};
    vs = {sn, sc, b * sh, sh, b * sw, sw};
    perm = crd ? std::vector<int64_t>{0, 1, 3, 5, 2, 4} : std::vector<int64_t>{0, 3, 5, 1, 2, 4};
  }
  Walk walk;
  for (int64_t p : perm) {
    walk.dims.push_back(view[static_cast<size_t>(p)]);
    walk.strides.push_back(vs[static_cast<size_t>(p)]);
  }
  return walk;
}

std::optional<std::vector<int64_t>> const_ints(const LayerRequest& r, size_t i) {
  if (!r.has_input(i)) return std::nullopt;
  return r.constants[i]->to_int_vector();
}

// In logical output order (to_memory_order applies the output layout).
Walk slice_walk(const LayerRequest& r) {
  const TensorSpec& in = *r.inputs[0];
  std::vector<ir::SliceAxis> params = ir::slice_params(r.node, ir::dims_of(in.shape), *const_ints(r, 1),
                                                       *const_ints(r, 2), const_ints(r, 3), const_ints(r, 4));
  Walk w;
  w.dims = r.output_shapes[0];
  w.strides = in.logical_strides();
  for (const ir::SliceAxis& p : params) {
    const size_t a = static_cast<size_t>(p.axis);
    if (p.length.value > 0) w.offset += p.start * w.strides[a];
    if (p.length.value > 1) w.strides[a] *= p.step;  // as the CPU kernel: one element never steps
  }
  return w;
}

Walk expand_walk(const LayerRequest& r) {
  const TensorSpec& in = *r.inputs[0];
  const std::vector<int64_t>& os = r.output_shapes[0];
  const size_t rank = os.size(), off = rank - in.shape.size();
  const std::vector<int64_t> in_strides = in.logical_strides();
  Walk w;
  w.dims = os;
  w.strides.assign(rank, 0);
  for (size_t i = off; i < rank; ++i) w.strides[i] = in.shape[i - off] == 1 ? 0 : in_strides[i - off];
  return w;
}

// Tile: output dim d of size r*n (n the input's) as [r, n] with source strides [0, stride].
Walk tile_walk(const LayerRequest& r) {
  const TensorSpec& in = *r.inputs[0];
  const std::vector<int64_t>& os = r.output_shapes[0];
  const std::vector<int64_t> in_strides = in.logical_strides();
  Walk w;
  for (size_t d = 0; d < os.size(); ++d) {
    const int64_t n = in.shape[d];
    const int64_t reps = n ? os[d] / n : 0;
    w.dims.push_back(reps);
    w.strides.push_back(0);
    w.dims.push_back(n);
    w.strides.push_back(in_strides[d]);
  }
  return w;
}

// --- Concat and Split: blocks of rows -----------------------------------------------------------

template <class U, class I>
__global__ void rows_copy_kernel(const U* __restrict__ src, int64_t src_pitch, U* __restrict__ dst, int64_t dst_pitch,
                                 int64_t row, int64_t n) {
  const I r_len = static_cast<I>(row), total = static_cast<I>(n);
  const I step = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const I r = i / r_len, c = i - r * r_len;
    dst[static_cast<int64_t>(r) * dst_pitch + c] = src[static_cast<int64_t>(r) * src_pitch + c];
  }
}

// Copies `rows` rows of `row_bytes` from src (pitch src_pitch bytes) to dst (dst_pitch bytes).
void copy_rows(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes, int64_t rows,
               size_t es, cudaStream_t stream) {
  if (row_bytes == 0 || rows == 0) return;
  if (rows == 1 || (src_pitch == row_bytes && dst_pitch == row_bytes)) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(row_bytes * rows), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  size_t unit = widest_unit(es, {static_cast<uint64_t>(src_pitch), static_cast<uint64_t>(dst_pitch),
                                 static_cast<uint64_t>(row_bytes)});
  unit = std::max(es, pointer_unit(unit, src, dst));
  const int64_t u = static_cast<int64_t>(unit);
  const int64_t row = row_bytes / u, n = row * rows;
  with_unit(unit, [&](auto tag) {
    using U = decltype(tag);
    if (n <= (int64_t{1} << 30))
      rows_copy_kernel<U, int32_t><<<grid_for(n, kBlock, 4), kBlock, 0, stream>>>(
          static_cast<const U*>(src), src_pitch / u, static_cast<U*>(dst), dst_pitch / u, row, n);
    else
      rows_copy_kernel<U, int64_t><<<grid_for(n, kBlock, 4), kBlock, 0, stream>>>(
          static_cast<const U*>(src), src_pitch / u, static_cast<U*>(dst), dst_pitch / u, row, n);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

// The memory-order axis of logical `axis` in a tensor of `rank` in `layout`.
size_t memory_axis(size_t axis, size_t rank, Layout layout) {
  if (layout == Layout::kNHWC && rank == 4) {
    static const size_t nhwc[4] = {0, 3, 1, 2};
    return nhwc[axis];
  }
  return axis;
}

struct Blocks {
  int64_t outer = 1, inner_bytes = 0;  // rows, bytes per unit of the axis
};

Blocks blocks_of(const std::vector<int64_t>& logical_shape, size_t axis, Layout layout, size_t es) {
  TensorSpec spec{logical_shape, Format{DType::kUInt8, layout}};
  std::vector<int64_t> phys = spec.physical_shape();
  size_t p = memory_axis(axis, logical_shape.size(), layout);
  Blocks b;
  int64_t inner = 1;
  for (size_t d = 0; d < p; ++d) b.outer *= phys[d];
  for (size_t d = p + 1; d < phys.size(); ++d) inner *= phys[d];
  b.inner_bytes = inner * static_cast<int64_t>(es);
  return b;
}

size_t concat_axis(const LayerRequest& r) {
  int64_t rank = static_cast<int64_t>(r.output_shapes[0].size());
  int64_t a = r.node.attrs.require_int("axis");
  return static_cast<size_t>(a < 0 ? a + rank : a);
}

bool concat_nhwc(const LayerRequest& r) {
  if (r.output_shapes[0].size() != 4) return false;
  bool any_runtime = false;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    if (!r.has_input(i) || r.is_constant(i)) continue;
    any_runtime = true;
    if (!stored_nhwc(r, i)) return false;
  }
  return any_runtime;
}

// --- Pad -------------------------------------------------------------------------------------

enum class PadMode : int { kConstant, kReflect, kEdge, kWrap };

struct PadParams {
  int rank = 0;
  int mode = 0;
  int64_t n = 0;
  int64_t out_dims[kMaxKernelRank] = {};  // output memory order
  int64_t in_dims[kMaxKernelRank] = {};   // per output dim
  int64_t begin[kMaxKernelRank] = {};
  int64_t strides[kMaxKernelRank] = {};   // input element strides per output dim
};

__device__ __forceinline__ int64_t pad_source(int64_t o, int64_t begin, int64_t n, int mode) {
  int64_t i = o - begin;
  if (i >= 0 && i < n) return i;
  switch (static_cast<PadMode>(mode)) {
    case PadMode::kConstant: return -1;
    case PadMode::kEdge: return i < 0 ? 0 : n - 1;
    case PadMode::kWrap: return ((i % n) + n) % n;
    case PadMode::kReflect: {
      if (n == 1) return 0;
      const int64_t period = 2 * (n - 1);
      const int64_t r = ((i % period) + period) % period;
      return r < n ? r : period - r;
    }
  }
  return -1;
}

template <class U>
__global__ void pad_kernel(const U* __restrict__ src, const U* __restrict__ fill, U* __restrict__ dst, PadParams p) {
  const U value = fill ? *fill : U{};
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += step) {
    int64_t rem = i, off = 0;
    bool pad = false;
#pragma unroll
    for (int d = kMaxKernelRank - 1; d >= 0; --d) {
      if (d >= p.rank) continue;
      const int64_t idx = rem % p.out_dims[d];
      rem /= p.out_dims[d];
      const int64_t s = pad_source(idx, p.begin[d], p.in_dims[d], p.mode);
      pad = pad || s < 0;
      off += s * p.strides[d];
    }
    dst[i] = pad ? value : src[off];
  }
}

// --- small generators --------------------------------------------------------------------------

template <class U>
__global__ void fill_kernel(U* __restrict__ dst, U value, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) dst[i] = value;
}

template <class U>
__global__ void eye_kernel(U* __restrict__ dst, U one, int64_t rows, int64_t cols, int64_t k) {
  const int64_t n = rows * cols;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t r = i / cols, c = i - r * cols;
    dst[i] = c - r == k ? one : U{};  // not c == r + k: k is any int64 from the file
  }
}

template <class U>
__global__ void trilu_kernel(const U* __restrict__ src, const int64_t* __restrict__ k_ptr, U* __restrict__ dst,
                             int64_t rows, int64_t cols, int64_t n, bool upper) {
  const int64_t k = k_ptr ? *k_ptr : 0;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t c = i % cols, r = (i / cols) % rows;
    const bool keep = upper ? c - r >= k : c - r <= k;
    dst[i] = keep ? src[i] : U{};
  }
}

// Range: start + i * delta in the input type T (as the CPU kernel), stored as Out.
template <class T, class Out>
__global__ void range_kernel(const T* __restrict__ start, const T* __restrict__ delta, Out* __restrict__ dst, int64_t n) {
  const T s = *start, d = *delta;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const T v = static_cast<T>(s + static_cast<T>(i) * d);
    if constexpr (std::is_same_v<Out, T>) dst[i] = v;
    else store_float(dst, i, static_cast<float>(v));
  }
}

// Index element as int64 the way the CPU reads OneHot's indices (through double).
template <class T> __device__ __forceinline__ bool index_value(const T* p, int64_t i, int64_t& out) {
  if constexpr (std::is_integral_v<T>) {
    out = static_cast<int64_t>(p[i]);
    return true;
  } else {
    double v;
    if constexpr (std::is_same_v<T, double>) v = p[i];
    else v = static_cast<double>(load_float(p, i));
    if (!(v > -9.0e18 && v < 9.0e18)) return false;  // NaN and values no int64 holds
    out = static_cast<int64_t>(v);
    return true;
  }
}

template <class T, class U>
__global__ void one_hot_kernel(const T* __restrict__ indices, const U* __restrict__ values, U* __restrict__ dst,
                               int64_t depth, int64_t inner, int64_t n) {
  const U off = values[0], on = values[1];
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t in = i % inner, rest = i / inner;
    const int64_t d = rest % depth, o = rest / depth;
    int64_t v = 0;
    bool hot = false;
    if (index_value(indices, o * inner + in, v)) {
      if (v < 0) v += depth;
      hot = v == d;
    }
    dst[i] = hot ? on : off;
  }
}

// Host: the bytes of value 1 in a storage dtype (as the CPU's EyeLike writes it).
uint64_t one_bits(DType dtype) {
  uint64_t bits = 0;
  switch (dtype) {
    case DType::kFloat32: { float f = 1.f; std::memcpy(&bits, &f, 4); break; }
    case DType::kFloat64: { double f = 1.0; std::memcpy(&bits, &f, 8); break; }
    case DType::kFloat16: bits = float_to_half(1.f); break;
    case DType::kBFloat16: bits = float_to_bfloat16(1.f); break;
    default: bits = 1;  // integers and bool: 1 in the low byte (little-endian)
  }
  return bits;
}

// Calls f(U{}) for an unsigned type of es bytes and passes `bits` as that type.
template <class F> void with_element(size_t es, F&& f) {
  switch (es) {
    case 1: f(uint8_t{}); return;
    case 2: f(uint16_t{}); return;
    case 4: f(uint32_t{}); return;
    case 8: f(uint64_t{}); return;
  }
  throw Error(ErrorKind::kUnsupported, "no CUDA kernel for elements of " + std::to_string(es) + " bytes");
}

template <class U> U from_bits(uint64_t bits) {
  U v;
  std::memcpy(&v, &bits, sizeof(U));
  return v;
}

void fill_value(void* dst, size_t es, uint64_t bits, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (bits == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(n) * es, stream));
    return;
  }
  with_element(es, [&](auto tag) {
    using U = decltype(tag);
    fill_kernel<U><<<grid_for(n, kBlock, 4), kBlock, 0, stream>>>(static_cast<U*>(dst), from_bits<U>(bits), n);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

bool is_range_type(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kInt16 || d == DType::kInt32 || d == DType::kInt64;
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(data_movement) {
  // Transpose: input in any layout, output kLinear.
  {
    LayerEntry e;
    e.op = "Transpose";
    e.dtypes = "all (float32 as float16 under fp16)";
    e.check = [](const LayerRequest& r) -> std::string {
      if (std::string why = storable(r.input_dtypes[0]); !why.empty()) return why;
      return walk_reason(transpose_walk(r));
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs = {data_format(r, 0, true)};
      f.outputs = {Format{r.storage_of(r.output_dtypes[0]), Layout::kLinear}};
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      try {
        return copy_layer(transpose_walk(r), element_size(f.inputs[0].dtype));
      } catch (const Error& err) {
        throw r.node.error(ErrorKind::kUnsupported, err.what());
      }
    };
    registry.add(std::move(e));
  }
  // DepthToSpace / SpaceToDepth: input in any layout, output kLinear.
  for (const char* op : {"DepthToSpace", "SpaceToDepth"}) {
    LayerEntry e;
    e.op = op;
    e.dtypes = "all (float32 as float16 under fp16)";
    e.check = [](const LayerRequest& r) -> std::string {
      if (std::string why = storable(r.input_dtypes[0]); !why.empty()) return why;
      if (r.inputs[0]->rank() != 4) return "the input must be 4-D";
      if (r.node.attrs.require_int("blocksize") <= 0) return "blocksize must be positive";
      return "";
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs = {data_format(r, 0, true)};
      f.outputs = {Format{r.storage_of(r.output_dtypes[0]), Layout::kLinear}};
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      return copy_layer(depth_space_walk(r), element_size(f.inputs[0].dtype));
    };
    registry.add(std::move(e));
  }
  // Slice: starts/ends/axes/steps constant; rank-4 kNHWC in and out when stored so.
  {
    LayerEntry e;
    e.op = "Slice";
    e.dtypes = "all (float32 as float16 under fp16)";
    e.check = [](const LayerRequest& r) -> std::string {
      if (std::string why = storable(r.input_dtypes[0]); !why.empty()) return why;
      static const char* names[] = {"", "starts", "ends", "axes", "steps"};
      for (size_t i = 1; i < 5; ++i)
        if ((i < 3 || r.has_input(i)) && !r.is_constant(i)) return std::string(names[i]) + " must be a constant";
      Walk w = to_memory_order(slice_walk(r), stored_nhwc(r, 0) ? Layout::kNHWC : Layout::kLinear);
      return walk_reason(w);
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs = {data_format(r, 0, true), Format{}, Format{}, Format{}, Format{}};
      f.inputs.resize(r.inputs.size());
      f.outputs = {Format{r.storage_of(r.output_dtypes[0]), f.inputs[0].layout}};
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      return copy_layer(to_memory_order(slice_walk(r), f.outputs[0].layout), element_size(f.inputs[0].dtype));
    };
    registry.add(std::move(e));
  }
  // Expand and Tile: the output shape says everything; the shape / repeats input is not read.
  for (const char* op : {"Expand", "Tile"}) {
    LayerEntry e;
    e.op = op;
    e.dtypes = "all (float32 as float16 under fp16)";
    e.check = [](const LayerRequest& r) -> std::string {
      if (std::string why = storable(r.input_dtypes[0]); !why.empty()) return why;
      return walk_reason(r.node.op == "Tile" ? tile_walk(r) : expand_walk(r));
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs = {data_format(r, 0, true), unused_format(r, 1)};
      f.outputs = {Format{r.storage_of(r.output_dtypes[0]), Layout::kLinear}};
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      return copy_layer(r.node.op == "Tile" ? tile_walk(r) : expand_walk(r), element_size(f.inputs[0].dtype));
    };
    registry.add(std::move(e));
  }
  // Concat: any number of inputs; kNHWC (any axis) when every runtime input is stored so.
  {
    LayerEntry e;
    e.op = "Concat";
    e.dtypes = "all (float32 as float16 under fp16)";
    e.check = [](const LayerRequest& r) -> std::string {
      return storable(r.output_dtypes[0]);
    };
    e.formats = [](const LayerRequest& r) {
      const Layout layout = concat_nhwc(r) ? Layout::kNHWC : Layout::kLinear;
      LayerFormats f;
      for (size_t i = 0; i < r.inputs.size(); ++i)
        f.inputs.push_back(r.has_input(i) ? Format{r.storage_of(r.input_dtypes[i]), layout} : Format{});
      f.outputs = {Format{r.storage_of(r.output_dtypes[0]), layout}};
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const Layout layout = f.outputs[0].layout;
      const size_t es = element_size(f.outputs[0].dtype);
      const size_t axis = concat_axis(r);
      const Blocks out = blocks_of(r.output_shapes[0], axis, layout, es);
      const int64_t out_pitch = r.output_shapes[0][axis] * out.inner_bytes;
      struct Part { size_t input; int64_t pos, bytes; };
      std::vector<Part> parts;
      int64_t pos = 0;
      for (size_t i = 0; i < r.inputs.size(); ++i) {
        if (!r.has_input(i)) continue;
        const int64_t bytes = r.inputs[i]->shape[axis] * out.inner_bytes;
        if (bytes > 0 && out.outer > 0) parts.push_back({i, pos, bytes});
        pos += bytes;
      }
      const int64_t rows = out.outer;
      return make_layer("kernel:concat(" + std::to_string(parts.size()) + " parts)",
                        [parts, rows, out_pitch, es](const LayerIO& io, cudaStream_t stream) {
                          for (const Part& p : parts)
                            copy_rows(io.inputs[p.input], p.bytes, static_cast<char*>(io.outputs[0]) + p.pos,
                                      out_pitch, p.bytes, rows, es, stream);
                        });
    };
    registry.add(std::move(e));
  }
  // Split: part sizes from the output shapes (so the split input is not read); kNHWC when
  // the input is stored so.
  {
    LayerEntry e;
    e.op = "Split";
    e.dtypes = "all (float32 as float16 under fp16)";
    e.check = [](const LayerRequest& r) -> std::string { return storable(r.input_dtypes[0]); };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs = {data_format(r, 0, true), unused_format(r, 1)};
      f.inputs.resize(r.inputs.size());
      for (size_t o = 0; o < r.output_dtypes.size(); ++o)
        f.outputs.push_back(Format{r.storage_of(r.output_dtypes[o]), f.inputs[0].layout});
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const Layout layout = f.inputs[0].layout;
      const size_t es = element_size(f.inputs[0].dtype);
      const std::vector<int64_t>& shape = r.inputs[0]->shape;
      const int64_t rank = static_cast<int64_t>(shape.size());
      int64_t a = r.node.attrs.get_int("axis", 0);
      const size_t axis = static_cast<size_t>(a < 0 ? a + rank : a);
      const Blocks in = blocks_of(shape, axis, layout, es);
      const int64_t in_pitch = shape[axis] * in.inner_bytes;
      struct Part { size_t output; int64_t pos, bytes; };
      std::vector<Part> parts;
      int64_t pos = 0;
      for (size_t o = 0; o < r.output_shapes.size(); ++o) {
        const int64_t bytes = r.output_shapes[o][axis] * in.inner_bytes;
        if (bytes > 0 && in.outer > 0) parts.push_back({o, pos, bytes});
        pos += bytes;
      }
      if (pos != in_pitch) throw r.node.error(ErrorKind::kInvalidModel, "the output sizes do not add up to the input's");
      const int64_t rows = in.outer;
      return make_layer("kernel:split(" + std::to_string(parts.size()) + " parts)",
                        [parts, rows, in_pitch, es](const LayerIO& io, cudaStream_t stream) {
                          for (const Part& p : parts)
                            if (io.outputs[p.output])
                              copy_rows(static_cast<const char*>(io.inputs[0]) + p.pos, in_pitch, io.outputs[p.output],
                                        p.bytes, p.bytes, rows, es, stream);
                        });
    };
    registry.add(std::move(e));
  }
  // Pad: pads and axes constant; constant_value read on the device (constant or not).
  {
    LayerEntry e;
    e.op = "Pad";
    e.dtypes = "all (float32 as float16 under fp16)";
    e.check = [](const LayerRequest& r) -> std::string {
      if (std::string why = storable(r.input_dtypes[0]); !why.empty()) return why;
      if (!r.is_constant(1)) return "pads must be a constant";
      if (r.has_input(3) && !r.is_constant(3)) return "axes must be a constant";
      if (r.inputs[0]->rank() > kMaxKernelRank)
        return "rank " + std::to_string(r.inputs[0]->rank()) + " is above the CUDA kernels' " + std::to_string(kMaxKernelRank);
      return "";
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs = {data_format(r, 0, true), Format{}, Format{}, Format{}};
      f.inputs.resize(r.inputs.size());
      f.outputs = {Format{r.storage_of(r.output_dtypes[0]), f.inputs[0].layout}};
      // A constant_value with elements is read on the device, in the data's storage dtype.
      if (r.has_input(2) && shape_numel(r.inputs[2]->shape) > 0) f.inputs[2] = param_format(r, 2, f.inputs[0].dtype);
      else if (r.has_input(2)) f.inputs[2] = unused_format(r, 2);
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const TensorSpec& in = *r.inputs[0];
      const int64_t rank = in.rank();
      const size_t es = element_size(f.inputs[0].dtype);
      std::optional<std::vector<int64_t>> axes;
      if (r.has_input(3)) axes = r.constants[3]->to_int_vector();
      const std::vector<int64_t> pads = ir::full_pads(r.node, rank, r.constants[1]->to_int_vector(), axes);
      const std::string m = r.node.attrs.get_string("mode", "constant");
      const PadMode mode = m == "reflect" ? PadMode::kReflect : m == "edge" ? PadMode::kEdge
                           : m == "wrap" ? PadMode::kWrap : PadMode::kConstant;
      const bool read_fill = r.has_input(2) && f.inputs[2].defined() && f.inputs[2].dtype == f.inputs[0].dtype &&
                             shape_numel(r.inputs[2]->shape) > 0;
      const Layout layout = f.outputs[0].layout;
      const std::vector<int64_t>& os = r.output_shapes[0];
      const std::vector<int64_t> strides = in.logical_strides();
      // Per logical dim, then in the output's memory order.
      std::vector<size_t> order(static_cast<size_t>(rank));
      std::iota(order.begin(), order.end(), size_t{0});
      if (layout == Layout::kNHWC && rank == 4) order = {0, 2, 3, 1};
      PadParams p;
      p.rank = static_cast<int>(rank);
      p.mode = static_cast<int>(mode);
      p.n = shape_numel(os);
      for (size_t k = 0; k < order.size(); ++k) {
        const size_t d = order[k];
        p.out_dims[k] = os[d];
        p.in_dims[k] = in.shape[d];
        p.begin[k] = pads[d];
        p.strides[k] = strides[d];
      }
      return make_layer("kernel:pad(" + m + ")", [p, es, read_fill](const LayerIO& io, cudaStream_t stream) {
        if (p.n == 0) return;
        if (p.rank == 0) {
          KILN_CUDA_CHECK(cudaMemcpyAsync(io.outputs[0], io.inputs[0], es, cudaMemcpyDeviceToDevice, stream));
          return;
        }
        with_element(es, [&](auto tag) {
          using U = decltype(tag);
          const U* fill = read_fill ? static_cast<const U*>(io.inputs[2]) : nullptr;
          pad_kernel<U><<<grid_for(p.n, kBlock, 4), kBlock, 0, stream>>>(static_cast<const U*>(io.inputs[0]), fill,
                                                                         static_cast<U*>(io.outputs[0]), p);
          KILN_CUDA_CHECK_LAUNCH();
        });
      });
    };
    registry.add(std::move(e));
  }
  // Trilu: k read on the device (constant or not).
  {
    LayerEntry e;
    e.op = "Trilu";
    e.dtypes = "all (float32 as float16 under fp16)";
    e.check = [](const LayerRequest& r) -> std::string {
      if (std::string why = storable(r.input_dtypes[0]); !why.empty()) return why;
      if (r.inputs[0]->rank() < 2) return "the input must have rank >= 2";
      if (r.has_input(1) && r.input_dtypes[1] != DType::kInt64) return "k must be int64";
      return "";
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs = {data_format(r, 0), param_format(r, 1, DType::kInt64)};
      f.inputs.resize(r.inputs.size());
      f.outputs = {Format{r.storage_of(r.output_dtypes[0]), Layout::kLinear}};
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const std::vector<int64_t>& s = r.inputs[0]->shape;
      const int64_t rows = s[s.size() - 2], cols = s.back(), n = shape_numel(s);
      const bool upper = r.node.attrs.get_int("upper", 1) != 0;
      const bool has_k = r.has_input(1);
      const size_t es = element_size(f.inputs[0].dtype);
      return make_layer("kernel:trilu", [=](const LayerIO& io, cudaStream_t stream) {
        if (n == 0) return;
        with_element(es, [&](auto tag) {
          using U = decltype(tag);
          trilu_kernel<U><<<grid_for(n, kBlock, 4), kBlock, 0, stream>>>(
              static_cast<const U*>(io.inputs[0]), has_k ? static_cast<const int64_t*>(io.inputs[1]) : nullptr,
              static_cast<U*>(io.outputs[0]), rows, cols, n, upper);
          KILN_CUDA_CHECK_LAUNCH();
        });
      });
    };
    registry.add(std::move(e));
  }
  // EyeLike: the input only gives the shape.
  {
    LayerEntry e;
    e.op = "EyeLike";
    e.dtypes = "all (float32 as float16 under fp16)";
    e.check = [](const LayerRequest& r) -> std::string {
      if (std::string why = storable(r.output_dtypes[0]); !why.empty()) return why;
      if (r.output_shapes[0].size() != 2) return "the input must be 2-D";
      return "";
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs = {unused_format(r, 0)};
      f.outputs = {Format{r.storage_of(r.output_dtypes[0]), Layout::kLinear}};
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const int64_t rows = r.output_shapes[0][0], cols = r.output_shapes[0][1];
      const int64_t k = r.node.attrs.get_int("k", 0);
      const DType dtype = f.outputs[0].dtype;
      const size_t es = element_size(dtype);
      const uint64_t one = one_bits(dtype);
      return make_layer("kernel:eye", [=](const LayerIO& io, cudaStream_t stream) {
        if (rows * cols == 0) return;
        with_element(es, [&](auto tag) {
          using U = decltype(tag);
          eye_kernel<U><<<grid_for(rows * cols, kBlock, 4), kBlock, 0, stream>>>(static_cast<U*>(io.outputs[0]),
                                                                                 from_bits<U>(one), rows, cols, k);
          KILN_CUDA_CHECK_LAUNCH();
        });
      });
    };
    registry.add(std::move(e));
  }
  // ConstantOfShape: the shape input is not read (the output shape is known).
  {
    LayerEntry e;
    e.op = "ConstantOfShape";
    e.dtypes = "all (float32 as float16 under fp16)";
    e.check = [](const LayerRequest& r) -> std::string { return storable(r.output_dtypes[0]); };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      f.inputs = {unused_format(r, 0)};
      f.outputs = {Format{r.storage_of(r.output_dtypes[0]), Layout::kLinear}};
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const Tensor* v = r.node.attrs.get_tensor("value");
      Tensor value = v ? *v : Tensor::scalar<float>(0.f);
      const DType storage = f.outputs[0].dtype;
      uint64_t bits = 0;
      if (storage != value.dtype()) value = convert_constant(value, Format{storage, Layout::kLinear});
      std::memcpy(&bits, value.raw(), element_size(storage));
      const size_t es = element_size(storage);
      const int64_t n = shape_numel(r.output_shapes[0]);
      return make_layer("kernel:fill", [=](const LayerIO& io, cudaStream_t stream) {
        fill_value(io.outputs[0], es, bits, n, stream);
      });
    };
    registry.add(std::move(e));
  }
  // Range: start and delta read on the device as float32/float64/int16/int32/int64 (constants
  // are uploaded; runtime scalars work as well); the length is the inferred output shape.
  {
    LayerEntry e;
    e.op = "Range";
    e.dtypes = "float32, float64, int16, int32, int64 (float32 stored as float16 under fp16)";
    e.check = [](const LayerRequest& r) -> std::string {
      if (!is_range_type(r.input_dtypes[0]))
        return "input type " + to_string(r.input_dtypes[0]) + " is not supported (supported: float32, float64, int16, int32, int64)";
      return "";
    };
    e.formats = [](const LayerRequest& r) {
      const DType d = r.input_dtypes[0];
      LayerFormats f;
      f.inputs = {param_format(r, 0, d), unused_format(r, 1), param_format(r, 2, d)};
      f.outputs = {Format{r.storage_of(r.output_dtypes[0]), Layout::kLinear}};
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const DType in = f.inputs[0].dtype, out = f.outputs[0].dtype;
      const int64_t n = shape_numel(r.output_shapes[0]);
      return make_layer("kernel:range", [=](const LayerIO& io, cudaStream_t stream) {
        if (n == 0) return;
        auto launch = [&](auto in_tag, auto out_tag) {
          using T = decltype(in_tag);
          using O = decltype(out_tag);
          range_kernel<T, O><<<grid_for(n, kBlock, 4), kBlock, 0, stream>>>(
              static_cast<const T*>(io.inputs[0]), static_cast<const T*>(io.inputs[2]), static_cast<O*>(io.outputs[0]), n);
          KILN_CUDA_CHECK_LAUNCH();
        };
        switch (in) {
          case DType::kFloat32:
            if (out == DType::kFloat16) launch(float{}, __half{});
            else launch(float{}, float{});
            break;
          case DType::kFloat64: launch(double{}, double{}); break;
          case DType::kInt16: launch(int16_t{}, int16_t{}); break;
          case DType::kInt32: launch(int32_t{}, int32_t{}); break;
          default: launch(int64_t{}, int64_t{}); break;
        }
      });
    };
    registry.add(std::move(e));
  }
  // OneHot: indices of any numeric type (read as the CPU does, through double for floats);
  // depth is the output's axis size; values (off, on) read on the device.
  {
    LayerEntry e;
    e.op = "OneHot";
    e.dtypes = "any numeric indices; any values (float32 as float16 under fp16)";
    e.check = [](const LayerRequest& r) -> std::string {
      if (std::string why = storable(r.output_dtypes[0]); !why.empty()) return why;
      const DType d = r.input_dtypes[0];
      if (!is_integer(d) && !is_float(d)) return "indices of type " + to_string(d) + " are not supported";
      if (shape_numel(r.inputs[2]->shape) != 2) return "values must have 2 elements";
      return "";
    };
    e.formats = [](const LayerRequest& r) {
      LayerFormats f;
      // Indices keep float32 even under fp16 (float16 cannot hold every index).
      f.inputs = {Format{r.input_dtypes[0], Layout::kLinear}, unused_format(r, 1),
                  param_format(r, 2, r.storage_of(r.input_dtypes[2]))};
      f.outputs = {Format{r.storage_of(r.output_dtypes[0]), Layout::kLinear}};
      return f;
    };
    e.create = [](const LayerRequest& r, const LayerFormats& f, BuildServices&) {
      const std::vector<int64_t>& os = r.output_shapes[0];
      const int64_t rank = static_cast<int64_t>(os.size());
      int64_t a = r.node.attrs.get_int("axis", -1);
      const size_t axis = static_cast<size_t>(a < 0 ? a + rank : a);
      int64_t inner = 1;
      for (size_t d = axis + 1; d < os.size(); ++d) inner *= os[d];
      const int64_t depth = os[axis], n = shape_numel(os);
      const DType idx = f.inputs[0].dtype;
      const size_t es = element_size(f.outputs[0].dtype);
      if (f.inputs[2].dtype != f.outputs[0].dtype)
        throw r.node.error(ErrorKind::kInvalidModel, "values must have the output's type");
      return make_layer("kernel:one_hot", [=](const LayerIO& io, cudaStream_t stream) {
        if (n == 0) return;
        with_element(es, [&](auto utag) {
          using U = decltype(utag);
          auto launch = [&](auto itag) {
            using T = decltype(itag);
            one_hot_kernel<T, U><<<grid_for(n, kBlock, 4), kBlock, 0, stream>>>(
                static_cast<const T*>(io.inputs[0]), static_cast<const U*>(io.inputs[2]), static_cast<U*>(io.outputs[0]),
                depth, inner, n);
            KILN_CUDA_CHECK_LAUNCH();
          };
          KILN_DISPATCH_ALL_TYPES(idx, T, [&] { launch(T{}); });
        });
      });
    };
    registry.add(std::move(e));
  }
  // NonZero: refused, its output length is only known when it runs.
  {
    LayerEntry e;
    e.op = "NonZero";
    e.dtypes = "none (data-dependent output shape)";
    e.check = [](const LayerRequest&) -> std::string {
      return "NonZero's output length depends on the data; the CUDA engine needs every shape at build time";
    };
    e.formats = [](const LayerRequest& r) { return uniform_formats(r, false, false); };
    e.create = [](const LayerRequest& r, const LayerFormats&, BuildServices&) -> std::unique_ptr<Layer> {
      throw r.node.error(ErrorKind::kUnsupported, "NonZero has no CUDA layer");
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cuda
