// kiln's INT8 convolution kernels (see int8_conv.h for what and why).
//
// The GEMM: rows are output pixels (M = batch * oh * ow), columns output channels (N = k), the
// reduction runs over the filter taps and input channels (K = r * s * c), in the order of the
// KRSC weights, so a weight row is one contiguous run of K bytes. A block computes a
// 128 x tile_n tile with 8 warps (4 along M, 2 along N; each warp 32 x tile_n/2 as m16n8k32
// products). A 16-byte chunk of A is 16 channels of one tap of one pixel (c is a multiple of
// 16), fetched with cp.async, or zero-filled where the tap falls in the padding. Shared-memory
// rows have their 16-byte chunks XOR-swizzled by row, so that ldmatrix reads eight rows of one
// chunk column without bank conflicts. The epilogue writes its results to a shared-memory
// tile, stored to memory in 16-byte rows.
#include "cuda/kernels/int8_conv.h"

#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <type_traits>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/int8_epilogue.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

using namespace int8_epilogue;

constexpr int kBlockM = 128;
constexpr int kBlockK = 64;  // bytes of K per pipeline stage (implicit GEMM)
constexpr int kStages = 3;
constexpr int kThreads = 256;
constexpr int kRowPad = 16;  // bytes after each row of the residual and output tiles

// Thread-block clusters (split K) and programmatic dependent launch are Hopper's (sm_90). Built
// for an older architecture too (KILN_CUDA_ARCHITECTURES), the code that uses them compiles out
// there, and the host never launches a kernel with them on such a GPU (hopper_features()).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define KILN_HOPPER_DEVICE_CODE 1
#else
#define KILN_HOPPER_DEVICE_CODE 0
#endif

// Programmatic dependent launch (kiln's default; TacticOptions::programmatic_launch): a kernel launched
// with it may start while the previous kernel in its stream or graph still runs, and must wait
// before it reads what that kernel writes or writes what it may still read. Both are no-ops in
// a kernel launched without it.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if KILN_HOPPER_DEVICE_CODE
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void let_next_kernel_start() {
#if KILN_HOPPER_DEVICE_CODE
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a (16x32, row-major) * b (32x8, column-major), int8 in, int32 sums.
__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte offset of chunk `chunk` of row `row` in a tile of rows of `chunks` 16-byte chunks
// (4, 8 or 16): eight consecutive rows put one chunk column in eight different bank groups.
template <int kChunks> __device__ __forceinline__ int swizzled(int row, int chunk) {
  static_assert(kChunks == 4 || kChunks % 8 == 0, "rows of 4, 8, 16... chunks");
  const int flip = kChunks == 4 ? (row >> 1) & 3 : row & 7;
  return (row * kChunks + (chunk ^ flip)) << 4;
}

struct KernelParams {
  Int8ConvGeometry g;
  Int8ConvArgs a;
  ir::Activation act;
  float inv_y_scale;  // 1 / y_scale (int8 output)
  int m;            // output pixels
  int k_total;      // r * s * c
  int k_tiles;      // implicit GEMM: stages of kBlockK bytes
  int k_splits;     // implicit GEMM: blocks of a cluster that share one tile's K (1: no cluster)
  int split_tiles;  // implicit GEMM: stages per split (the last split may have fewer)
  int m_tiles;      // blocks of kBlockM pixels
  bool contiguous;  // 1x1, stride 1: pixel m's input row is row m
  bool programmatic_launch;  // launched with programmatic dependent launch (asked for, and Hopper)
};

// One warp's products over an A tile (kBlockM rows) and a B tile (weights, tile_n rows), both
// of rows of kChunks swizzled 16-byte chunks.
template <int kTilesN, int kChunks>
__device__ __forceinline__ void warp_products(int (&acc)[2][kTilesN][4], const uint8_t* a_tile, const uint8_t* b_tile, int warp_m,
                                              int warp_n, int lane) {
  constexpr int kWarpN = kTilesN * 8;
#pragma unroll
  for (int k = 0; k < kChunks * 16; k += 32) {
    const int chunk = k >> 4;
    uint32_t a[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) ldmatrix_x4(a[mt], a_tile + swizzled<kChunks>(warp_m * 32 + mt * 16 + (lane & 15), chunk + (lane >> 4)));
#pragma unroll
    for (int np = 0; np < kTilesN / 2; ++np) {
      uint32_t b[4];
      const int n = warp_n * kWarpN + np * 16 + (lane & 7) + ((lane >> 4) << 3);
      ldmatrix_x4(b, b_tile + swizzled<kChunks>(n, chunk + ((lane >> 3) & 1)));
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mma_s8(acc[mt][2 * np], a[mt], b[0], b[1]);
        mma_s8(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// The epilogue of a warp's accumulators into the output tile (shared memory, rows of
// y_pitch bytes), reading residuals from the residual tile (rows of z_pitch bytes). mult and
// bias point at the block's first column (bias may be null).
template <int kTilesN, class YT, class ZT, int kAct>
__device__ __forceinline__ void warp_epilogue(const int (&acc)[2][kTilesN][4], const float* mult, const float* bias,
                                              const uint8_t* z_tile, int z_pitch, uint8_t* y_tile, int y_pitch,
                                              const KernelParams& p, int warp_m, int warp_n, int lane) {
  constexpr int kWarpN = kTilesN * 8;
  constexpr int kZBytes = std::is_void_v<ZT> ? 1 : sizeof(std::conditional_t<std::is_void_v<ZT>, int8_t, ZT>);
  const int group = lane >> 2, quad = lane & 3;
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt) {
    const int col = warp_n * kWarpN + nt * 8 + quad * 2;
    const float2 m2 = make_float2(mult[col], mult[col + 1]);
    const float2 b2 = bias ? make_float2(bias[col], bias[col + 1]) : make_float2(0.f, 0.f);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = warp_m * 32 + mt * 16 + group + half * 8;
        epilogue_pair<YT, ZT, kAct>(acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1], m2, b2, z_tile + row * z_pitch + col * kZBytes,
                                    p.a.z_scale, y_tile + row * y_pitch + col * static_cast<int>(sizeof(YT)), p.inv_y_scale, p.act);
      }
    }
  }
}

// Stores rows [m_base, m_base + kBlockM) of the output tile (those below p.m) in 16-byte units.
template <int kBlockN, class YT>
__device__ __forceinline__ void store_tile(const uint8_t* y_tile, int y_pitch, const KernelParams& p, int m_base, int n_base) {
  constexpr int kChunksPerRow = kBlockN * static_cast<int>(sizeof(YT)) / 16;
  uint8_t* y = static_cast<uint8_t*>(p.a.y);
  for (int i = threadIdx.x; i < kBlockM * kChunksPerRow; i += kThreads) {
    const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
    const int m = m_base + row;
    if (m < p.m)
      *reinterpret_cast<uint4*>(y + (static_cast<int64_t>(m) * p.g.k + n_base) * static_cast<int64_t>(sizeof(YT)) + chunk * 16) =
          *reinterpret_cast<const uint4*>(y_tile + row * y_pitch + chunk * 16);
  }
}

// Loads rows [m_base, m_base + kBlockM) of the residual (columns from n_base) into z_tile.
template <int kBlockN, class ZT>
__device__ __forceinline__ void load_residual(uint8_t* z_tile, int z_pitch, const KernelParams& p, int m_base, int n_base) {
  if constexpr (!std::is_void_v<ZT>) {
    constexpr int kChunksPerRow = kBlockN * static_cast<int>(sizeof(ZT)) / 16;
    const uint8_t* z = static_cast<const uint8_t*>(p.a.z);
    for (int i = threadIdx.x; i < kBlockM * kChunksPerRow; i += kThreads) {
      const int row = i / kChunksPerRow, chunk = i % kChunksPerRow;
      const int m = m_base + row;
      const bool valid = m < p.m;
      const uint8_t* src = valid ? z + (static_cast<int64_t>(m) * p.g.k + n_base) * static_cast<int64_t>(sizeof(ZT)) + chunk * 16 : z;
      cp_async16(z_tile + row * z_pitch + chunk * 16, src, valid);
    }
  }
}

template <int kBlockN, class T> __host__ __device__ constexpr int tile_pitch() {
  if constexpr (std::is_void_v<T>) return 0;
  else return kBlockN * static_cast<int>(sizeof(T)) + kRowPad;
}

// ---- kImplicitGemm ----------------------------------------------------------------------

// Split K (k_splits > 1, tile_n 64): the k_splits blocks of a thread-block cluster compute
// one output tile, each over its own run of K stages; the others leave their int32 sums in
// their shared memory, and the cluster's first block adds them (distributed shared memory) and
// runs the epilogue. Integer sums, so the result is the unsplit kernel's, bit for bit. Meant
// for batch 1, where a layer has few tiles (ResNet-50's layer4: 8 blocks for 132
// multiprocessors, each walking K = 4608 alone); it won those layers timed alone but made the
// engine slower, so the build offers it only on request (int8_conv_tactics).
template <int kBlockN, class YT, class ZT, int kAct>
__global__ void __launch_bounds__(kThreads) implicit_gemm_kernel(const KernelParams p) {
  constexpr int kTilesN = kBlockN / 16;  // per warp (two warps along N)
  constexpr int kStageBytes = (kBlockM + kBlockN) * kBlockK;
  constexpr int kZPitch = tile_pitch<kBlockN, ZT>(), kYPitch = tile_pitch<kBlockN, YT>();
  constexpr int kAcc = 2 * kTilesN * 4;  // int32 sums per thread
  static_assert(kBlockM * kYPitch <= kStages * kStageBytes, "the output tile reuses the pipeline's buffers");
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* z_tile = smem + kStages * kStageBytes;

  const Int8ConvGeometry& g = p.g;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp & 3, warp_n = warp >> 2;
  const int n_blocks = g.k / kBlockN;
  const int split = p.k_splits > 1 ? static_cast<int>(blockIdx.x) % p.k_splits : 0;  // the block's rank in its cluster
  const int tile = static_cast<int>(blockIdx.x) / p.k_splits;
  const int m_base = (tile / n_blocks) * kBlockM;
  const int n_base = (tile % n_blocks) * kBlockN;
  const int kt_begin = split * p.split_tiles;
  const int kt_end = min(p.k_tiles, kt_begin + p.split_tiles);

  if (split == 0) load_residual<kBlockN, ZT>(z_tile, kZPitch, p, m_base, n_base);  // overlaps the main loop

  // The two A rows this thread loads (rows tid/4 and tid/4 + 64, chunk tid%4 of each stage).
  const int a_chunk = tid & 3;
  int64_t a_image[2];
  int a_ih[2], a_iw[2];
  bool a_valid[2];
  const int pixels = g.oh * g.ow;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int m = m_base + (tid >> 2) + i * 64;
    a_valid[i] = m < p.m;
    const int image = a_valid[i] ? m / pixels : 0;
    const int rem = a_valid[i] ? m - image * pixels : 0;
    a_image[i] = static_cast<int64_t>(image) * g.h * g.w * g.c;
    a_ih[i] = (rem / g.ow) * g.stride_h - g.pad_h;
    a_iw[i] = (rem % g.ow) * g.stride_w - g.pad_w;
  }
  auto load_stage = [&](int stage, int k_tile) {
    uint8_t* a_tile = smem + stage * kStageBytes;
    uint8_t* b_tile = a_tile + kBlockM * kBlockK;
    const int k = k_tile * kBlockK + a_chunk * 16;
    const bool k_valid = k < p.k_total;
    const int tap = k / g.c, c = k - tap * g.c;
    const int dh = (tap / g.s) * g.dil_h, dw = (tap % g.s) * g.dil_w;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int ih = a_ih[i] + dh, iw = a_iw[i] + dw;
      const bool valid = k_valid && a_valid[i] && ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
      const int8_t* src = valid ? p.a.x + a_image[i] + (static_cast<int64_t>(ih) * g.w + iw) * g.c + c : p.a.x;
      cp_async16(a_tile + swizzled<4>((tid >> 2) + i * 64, a_chunk), src, valid);
    }
    for (int i = tid; i < kBlockN * 4; i += kThreads) {
      const int n = i >> 2, chunk = i & 3;
      const int kb = k_tile * kBlockK + chunk * 16;
      const bool valid = kb < p.k_total;
      const int8_t* src = valid ? p.a.w + static_cast<int64_t>(n_base + n) * p.k_total + kb : p.a.w;
      cp_async16(b_tile + swizzled<4>(n, chunk), src, valid);
    }
  };

  int acc[2][kTilesN][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (kt_begin + s < kt_end) load_stage(s, kt_begin + s);
    cp_async_commit();
  }
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < kt_end) load_stage((next - kt_begin) % kStages, next);
    cp_async_commit();
    const uint8_t* a_tile = smem + ((kt - kt_begin) % kStages) * kStageBytes;
    warp_products<kTilesN, kBlockK / 16>(acc, a_tile, a_tile + kBlockM * kBlockK, warp_m, warp_n, lane);
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline's buffers; the residual tile is in

  if constexpr (kAcc * kThreads * 4 <= kStages * kStageBytes) {
    if (p.k_splits > 1) {
#if KILN_HOPPER_DEVICE_CODE
      namespace cg = cooperative_groups;
      cg::cluster_group cluster = cg::this_cluster();
      int* sums = reinterpret_cast<int*>(smem);  // [kAcc][kThreads], over the pipeline's buffers
      if (split != 0) {
#pragma unroll
        for (int i = 0; i < kAcc; ++i) sums[i * kThreads + tid] = (&acc[0][0][0])[i];
      }
      cluster.sync();  // every block's sums are written
      if (split == 0) {
        for (int r = 1; r < p.k_splits; ++r) {
          const int* other = cluster.map_shared_rank(sums, r);
#pragma unroll
          for (int i = 0; i < kAcc; ++i) (&acc[0][0][0])[i] += other[i * kThreads + tid];
        }
      }
      cluster.sync();  // the first block has read the others' shared memory: they may leave
      if (split != 0) return;
#else
      __trap();  // split K runs in clusters, offered on Hopper only
#endif
    }
  }

  warp_epilogue<kTilesN, YT, ZT, kAct>(acc, p.a.mult + n_base, p.a.bias ? p.a.bias + n_base : nullptr, z_tile, kZPitch, smem,
                                       kYPitch, p, warp_m, warp_n, lane);
  __syncthreads();
  store_tile<kBlockN, YT>(smem, kYPitch, p, m_base, n_base);
}

template <int kBlockN, class YT, class ZT>
constexpr int implicit_gemm_smem() {
  return kStages * (kBlockM + kBlockN) * kBlockK + kBlockM * tile_pitch<kBlockN, ZT>();
}

// ---- kStream1x1 ----------------------------------------------------------------------------
// gridDim.x = n_blocks * blocks_per_column: block b keeps column block b % n_blocks (its
// weights, multipliers and biases in shared memory) and walks the row tiles b / n_blocks,
// + blocks_per_column, ..., with the next tile's pixels and residuals loading (double
// buffered) while it computes, finishes and stores the current one. K = kC (64, 128 or 256)
// is a template parameter, so that every thread's share of each tile's loads and stores is a
// fixed set of offsets computed once (the per-tile address arithmetic was a large part of the
// first version's instructions).

// Byte offsets in shared memory; buffer b of A (and of Z) is at a + b * a_size.
struct StreamLayout {
  int w, a, a_size, z, z_size, y, vectors, total;
};

template <int kC, int kBlockN, class YT, class ZT>
__host__ __device__ constexpr StreamLayout stream_layout() {
  StreamLayout l{};
  int at = 0;
  l.w = at, at += kBlockN * kC;
  l.a = at, l.a_size = kBlockM * kC, at += 2 * l.a_size;
  l.z = at, l.z_size = kBlockM * tile_pitch<kBlockN, ZT>(), at += 2 * l.z_size;
  l.y = at, at += kBlockM * tile_pitch<kBlockN, YT>();
  l.vectors = at, at += 2 * kBlockN * static_cast<int>(sizeof(float));
  l.total = at;
  return l;
}

// This thread's 16-byte chunks of a kBlockM-row tile of rows of kRowBytes: for the j-th, the
// row and the byte offset within the row.
template <int kRowBytes>
struct TileChunks {
  static constexpr int kPerRow = kRowBytes / 16;
  static constexpr int kCount = kBlockM * kPerRow / kThreads;
  static_assert(kCount * kThreads == kBlockM * kPerRow, "whole chunks per thread");
  __device__ __forceinline__ static int row(int j) { return (static_cast<int>(threadIdx.x) + j * kThreads) / kPerRow; }
  __device__ __forceinline__ static int col(int j) { return (static_cast<int>(threadIdx.x) + j * kThreads) % kPerRow * 16; }
};

template <int kC, int kBlockN, class YT, class ZT, int kAct>
__global__ void __launch_bounds__(kThreads, 2) stream1x1_kernel(const KernelParams p) {
  constexpr int kTilesN = kBlockN / 16;
  constexpr int kChunks = kC / 16;
  constexpr bool kHasZ = !std::is_void_v<ZT>;
  constexpr int kZBytes = kHasZ ? sizeof(std::conditional_t<kHasZ, ZT, int8_t>) : 0;
  constexpr int kZPitch = tile_pitch<kBlockN, ZT>(), kYPitch = tile_pitch<kBlockN, YT>();
  constexpr StreamLayout kLayout = stream_layout<kC, kBlockN, YT, ZT>();
  using AChunks = TileChunks<kC>;
  using ZChunks = TileChunks<kBlockN * (kHasZ ? kZBytes : 1)>;
  using YChunks = TileChunks<kBlockN * static_cast<int>(sizeof(YT))>;
  extern __shared__ __align__(128) uint8_t smem[];
  const Int8ConvGeometry& g = p.g;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp & 3, warp_n = warp >> 2;
  const int n_blocks = g.k / kBlockN;
  const int n_base = static_cast<int>(blockIdx.x % n_blocks) * kBlockN;
  const int stride = static_cast<int>(gridDim.x / n_blocks);

  // The block's weights (first commit group, with the first tile) and epilogue vectors.
  for (int i = tid; i < kBlockN * kChunks; i += kThreads) {
    const int n = i / kChunks, chunk = i % kChunks;
    cp_async16(smem + kLayout.w + swizzled<kChunks>(n, chunk), p.a.w + static_cast<int64_t>(n_base + n) * kC + chunk * 16, true);
  }
  float* mult = reinterpret_cast<float*>(smem + kLayout.vectors);
  float* bias = mult + kBlockN;
  for (int i = tid; i < kBlockN; i += kThreads) {
    mult[i] = p.a.mult[n_base + i];
    bias[i] = p.a.bias ? p.a.bias[n_base + i] : 0.f;
  }
  // Row strides of the residual and output in bytes, and this block's column offset in them.
  const int64_t zy_row = static_cast<int64_t>(g.k);
  const int8_t* x = p.a.x;
  // The weights and vectors above are the model's; the pixels and residuals below may be the
  // previous kernel's output (under programmatic dependent launch this block may have started
  // before that kernel ended).
  wait_for_previous_kernel();
  let_next_kernel_start();  // its blocks wait in turn; ours are all resident (one wave)

  auto load_tile = [&](int buffer, int tile) {
    const int m_base = tile * kBlockM;
    uint8_t* a_tile = smem + kLayout.a + buffer * kLayout.a_size;
#pragma unroll
    for (int j = 0; j < AChunks::kCount; ++j) {
      const int row = AChunks::row(j), m = m_base + row;
      const bool valid = m < p.m;
      int64_t pixel = m;
      if (!p.contiguous && valid) {  // a strided 1x1: pixel m's input pixel
        const int pixels = g.oh * g.ow, image = m / pixels, rem = m - image * pixels;
        pixel = (static_cast<int64_t>(image) * g.h + (rem / g.ow) * g.stride_h) * g.w + (rem % g.ow) * g.stride_w;
      }
      cp_async16(a_tile + swizzled<kChunks>(row, AChunks::col(j) / 16), valid ? x + pixel * kC + AChunks::col(j) : x, valid);
    }
    if constexpr (kHasZ) {
      uint8_t* z_tile = smem + kLayout.z + buffer * kLayout.z_size;
      const uint8_t* z = static_cast<const uint8_t*>(p.a.z);
#pragma unroll
      for (int j = 0; j < ZChunks::kCount; ++j) {
        const int row = ZChunks::row(j), m = m_base + row;
        const bool valid = m < p.m;
        cp_async16(z_tile + row * kZPitch + ZChunks::col(j),
                   valid ? z + (m * zy_row + n_base) * kZBytes + ZChunks::col(j) : z, valid);
      }
    }
  };

  int buffer = 0;
  int tile = static_cast<int>(blockIdx.x / n_blocks);
  if (tile < p.m_tiles) load_tile(0, tile);
  cp_async_commit();
  uint8_t* y = static_cast<uint8_t*>(p.a.y);
  for (; tile < p.m_tiles; tile += stride, buffer ^= 1) {
    if (tile + stride < p.m_tiles) load_tile(buffer ^ 1, tile + stride);
    cp_async_commit();
    cp_async_wait<1>();  // this tile's group (and the weights) have landed
    __syncthreads();
    int acc[2][kTilesN][4] = {};
    warp_products<kTilesN, kChunks>(acc, smem + kLayout.a + buffer * kLayout.a_size, smem + kLayout.w, warp_m, warp_n, lane);
    warp_epilogue<kTilesN, YT, ZT, kAct>(acc, mult, bias, smem + kLayout.z + buffer * kLayout.z_size, kZPitch, smem + kLayout.y,
                                         kYPitch, p, warp_m, warp_n, lane);
    __syncthreads();  // the output tile is complete; this tile's buffers are free to refill
    const int m_base = tile * kBlockM;
#pragma unroll
    for (int j = 0; j < YChunks::kCount; ++j) {
      const int row = YChunks::row(j), m = m_base + row;
      if (m < p.m)
        *reinterpret_cast<uint4*>(y + (m * zy_row + n_base) * static_cast<int64_t>(sizeof(YT)) + YChunks::col(j)) =
            *reinterpret_cast<const uint4*>(smem + kLayout.y + row * kYPitch + YChunks::col(j));
    }
  }
  cp_async_wait<0>();
}

// ---- kSmallM -------------------------------------------------------------------------------
// Layers of few output pixels (batch 1 from ResNet-50's layer2 on: 784 to 49 pixels), where a
// layer's time is latency: the implicit GEMM above walks K in 64-byte stages, one global-memory
// round trip each: ResNet-50's layer4 3x3 (K = 4608) takes 72 of them, 16.4 us timed in a graph
// even split 8 ways (cuDNN's INT8 engine 14.0 us, fp16 11.6: docs/design/int8.md, "Split K over
// a cluster").
// This kernel takes 64 pixels x 64 channels per block and 256 bytes of K per stage
// (four times fewer round trips), four stages in flight, and optionally splits K over a
// cluster of 2-8 blocks. With split K each block of the cluster adds the others' int32 sums of
// its own share of the tile (one eighth, quarter or half of every thread's fragments, through
// distributed shared memory) and runs the epilogue for that share, so the reduction is spread
// over the cluster rather than left to one block. The epilogue writes its pairs straight to
// memory: at these sizes a staged, coalesced store is not worth its synchronization.
constexpr int kSmallBlockM = 64;
constexpr int kSmallBlockN = 64;
constexpr int kSmallBlockK = 256;  // bytes of K per stage
constexpr int kSmallStages = 4;
constexpr int kSmallStageBytes = (kSmallBlockM + kSmallBlockN) * kSmallBlockK;
constexpr int kSmallSmem = kSmallStages * kSmallStageBytes;
constexpr int kSmallMaxBlocks = 264;  // blocks of a launch the build offers the kernel for

template <class YT, class ZT, int kAct>
__global__ void __launch_bounds__(kThreads) small_m_kernel(const KernelParams p) {
  constexpr int kTilesN = 2;                       // 8 warps: 2 along M x 4 along N, 32 x 16 each
  constexpr int kChunks = kSmallBlockK / 16;       // 16-byte chunks per row per stage
  constexpr int kAcc = 2 * kTilesN * 4;            // int32 sums per thread
  constexpr int kPairs = kAcc / 2;                 // output pairs per thread (epilogue groups)
  static_assert(kAcc * kThreads * 4 <= kSmallSmem, "the split sums reuse the pipeline's buffers");
  static_assert(kSmallBlockM * kChunks == 4 * kThreads && kSmallBlockN * kChunks == 4 * kThreads, "four chunks per thread");
  extern __shared__ __align__(128) uint8_t smem[];

  const Int8ConvGeometry& g = p.g;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp & 1, warp_n = warp >> 1;
  const int n_blocks = (g.k + kSmallBlockN - 1) / kSmallBlockN;
  const int split = p.k_splits > 1 ? static_cast<int>(blockIdx.x) % p.k_splits : 0;  // the block's rank in its cluster
  const int tile = static_cast<int>(blockIdx.x) / p.k_splits;
  const int m_base = (tile / n_blocks) * kSmallBlockM;
  const int n_base = (tile % n_blocks) * kSmallBlockN;
  const int kt_begin = split * p.split_tiles;
  const int kt_end = min(p.k_tiles, kt_begin + p.split_tiles);

  // This thread loads row tid / 4 of both tiles (a pixel of A, an output channel of B), chunks
  // tid % 4 + 4 j of each stage.
  const int row = tid >> 2, chunk0 = tid & 3;
  const int m = m_base + row;
  const bool m_valid = m < p.m;
  const int pixels = g.oh * g.ow;
  const int image = m_valid ? m / pixels : 0;
  const int rem = m_valid ? m - image * pixels : 0;
  const int8_t* x_image = p.a.x + static_cast<int64_t>(image) * g.h * g.w * g.c;
  const int ih0 = (rem / g.ow) * g.stride_h - g.pad_h, iw0 = (rem % g.ow) * g.stride_w - g.pad_w;
  const int8_t* w_row = p.a.w + static_cast<int64_t>(n_base + row) * p.k_total;
  const bool n_valid = n_base + row < g.k;  // the last tile of a layer of k % 64 != 0 (an FC's 1008)
  auto load_a = [&](int stage, int k_tile) {
    uint8_t* a_tile = smem + stage * kSmallStageBytes;
#pragma unroll
    for (int j = 0; j < kChunks / 4; ++j) {
      const int chunk = chunk0 + 4 * j;
      const int k = k_tile * kSmallBlockK + chunk * 16;
      const int tap = k / g.c, c = k - tap * g.c;
      const int ih = ih0 + (tap / g.s) * g.dil_h, iw = iw0 + (tap % g.s) * g.dil_w;
      const bool valid = k < p.k_total && m_valid && ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
      cp_async16(a_tile + swizzled<kChunks>(row, chunk), valid ? x_image + (static_cast<int64_t>(ih) * g.w + iw) * g.c + c : p.a.x,
                 valid);
    }
  };
  auto load_b = [&](int stage, int k_tile) {
    uint8_t* b_tile = smem + stage * kSmallStageBytes + kSmallBlockM * kSmallBlockK;
#pragma unroll
    for (int j = 0; j < kChunks / 4; ++j) {
      const int chunk = chunk0 + 4 * j;
      const int k = k_tile * kSmallBlockK + chunk * 16;
      const bool valid = k < p.k_total && n_valid;
      cp_async16(b_tile + swizzled<kChunks>(row, chunk), valid ? w_row + k : p.a.w, valid);
    }
  };

  // The epilogue's per-channel vectors and the first stages' weights do not depend on the
  // previous kernel: they load before waiting for it (with PDL, while it finishes).
  const int group = lane >> 2, quad = lane & 3;
  float2 mult2[kTilesN], bias2[kTilesN];
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt) {
    const int col = n_base + warp_n * (kTilesN * 8) + nt * 8 + quad * 2;
    const bool col_valid = col < g.k;
    mult2[nt] = col_valid ? make_float2(p.a.mult[col], p.a.mult[col + 1]) : make_float2(0.f, 0.f);
    bias2[nt] = col_valid && p.a.bias ? make_float2(p.a.bias[col], p.a.bias[col + 1]) : make_float2(0.f, 0.f);
  }
#pragma unroll
  for (int s = 0; s < kSmallStages - 1; ++s)
    if (kt_begin + s < kt_end) load_b(s, kt_begin + s);
  wait_for_previous_kernel();
  // The residual pairs this block finishes, read now so that their latency hides behind K.
  using ZPair = std::conditional_t<std::is_same_v<ZT, __half>, __half2, char2>;  // what epilogue_pair reads
  ZPair z_pairs[2][kTilesN][2] = {};
  if constexpr (!std::is_void_v<ZT>) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int q = (mt * kTilesN + nt) * 2 + half;
          const int out_m = m_base + warp_m * 32 + mt * 16 + group + half * 8;
          const int col = n_base + warp_n * (kTilesN * 8) + nt * 8 + quad * 2;
          if (q % p.k_splits == split && out_m < p.m && col < g.k)
            z_pairs[mt][nt][half] = *reinterpret_cast<const ZPair*>(static_cast<const uint8_t*>(p.a.z) +
                                                                   (static_cast<int64_t>(out_m) * g.k + col) * sizeof(ZT));
        }
  }

  int acc[2][kTilesN][4] = {};
#pragma unroll
  for (int s = 0; s < kSmallStages - 1; ++s) {
    if (kt_begin + s < kt_end) load_a(s, kt_begin + s);
    cp_async_commit();
  }
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    cp_async_wait<kSmallStages - 2>();
    __syncthreads();
    const int next = kt + kSmallStages - 1;
    if (next < kt_end) load_a((next - kt_begin) % kSmallStages, next), load_b((next - kt_begin) % kSmallStages, next);
    cp_async_commit();
    const uint8_t* a_tile = smem + ((kt - kt_begin) % kSmallStages) * kSmallStageBytes;
    warp_products<kTilesN, kChunks>(acc, a_tile, a_tile + kSmallBlockM * kSmallBlockK, warp_m, warp_n, lane);
  }
  cp_async_wait<0>();
  let_next_kernel_start();  // its blocks may take the free multiprocessors and load their weights

  // Pair q of this thread is acc[mt][nt][2 * half + {0, 1}] with q = (mt * kTilesN + nt) * 2 +
  // half, flat sums 2q and 2q + 1; block `split` finishes the pairs with q % k_splits == split.
  int* flat = &acc[0][0][0];
  if (p.k_splits > 1) {
#if KILN_HOPPER_DEVICE_CODE
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    __syncthreads();  // every warp is done with the pipeline's buffers
    int* sums = reinterpret_cast<int*>(smem);  // [kAcc][kThreads]
#pragma unroll
    for (int i = 0; i < kAcc; ++i) sums[i * kThreads + tid] = flat[i];
    cluster.sync();  // every block's sums are written
    for (int r = 1; r < p.k_splits; ++r) {
      const int* other = cluster.map_shared_rank(sums, (split + r) % p.k_splits);
#pragma unroll
      for (int q = 0; q < kPairs; ++q)
        if (q % p.k_splits == split) {
          flat[2 * q] += other[(2 * q) * kThreads + tid];
          flat[2 * q + 1] += other[(2 * q + 1) * kThreads + tid];
        }
    }
    cluster.sync();  // the others have read this block's shared memory: it may leave
#else
    __trap();  // split K runs in clusters, offered on Hopper only
#endif
  }

  constexpr int kYBytes = static_cast<int>(sizeof(YT));
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt) {
      const int col = n_base + warp_n * (kTilesN * 8) + nt * 8 + quad * 2;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int q = (mt * kTilesN + nt) * 2 + half;
        const int out_m = m_base + warp_m * 32 + mt * 16 + group + half * 8;
        if (q % p.k_splits != split || out_m >= p.m || col >= g.k) continue;
        const int64_t at = static_cast<int64_t>(out_m) * g.k + col;
        epilogue_pair<YT, ZT, kAct>(flat[2 * q], flat[2 * q + 1], mult2[nt], bias2[nt], &z_pairs[mt][nt][half], p.a.z_scale,
                                    static_cast<uint8_t*>(p.a.y) + at * kYBytes, p.inv_y_scale, p.act);
      }
    }
  }
}

// ---- launching -----------------------------------------------------------------------------

// Every INT8 kernel takes all of L1 as shared memory (prepare_kernel, common.cuh, says why).
template <class Kernel>
KernelOccupancy prepare(Kernel kernel, int smem) {
  return prepare_kernel(kernel, kThreads, smem, /*all_shared=*/true, "kiln INT8 convolution");
}

// Launches `blocks` blocks, in clusters of `splits` (the blocks that share a tile's K) when
// splits > 1, and with programmatic dependent launch when `pdl`.
template <class Kernel>
void launch_blocks(Kernel kernel, int64_t blocks, int smem, int splits, bool pdl, const KernelParams& p, cudaStream_t stream) {
  if (splits == 1 && !pdl) {
    kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(p);
    return;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = stream;
  cudaLaunchAttribute attrs[2];
  unsigned count = 0;
  if (splits > 1) {
    attrs[count].id = cudaLaunchAttributeClusterDimension;
    attrs[count].val.clusterDim.x = static_cast<unsigned>(splits);
    attrs[count].val.clusterDim.y = 1;
    attrs[count].val.clusterDim.z = 1;
    ++count;
  }
  if (pdl) {
    attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = attrs;
  config.numAttrs = count;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p));
}

template <int kC, int kBlockN, class YT, class ZT, int kAct>
void launch_stream(const KernelParams& p, cudaStream_t stream) {
  auto kernel = stream1x1_kernel<kC, kBlockN, YT, ZT, kAct>;
  constexpr int smem = stream_layout<kC, kBlockN, YT, ZT>().total;
  const KernelOccupancy info = prepare(kernel, smem);
  const int n_blocks = p.g.k / kBlockN;
  const int per_column = std::clamp(info.blocks_per_sm * info.sms / n_blocks, 1, p.m_tiles);
  launch_blocks(kernel, int64_t{per_column} * n_blocks, smem, 1, p.programmatic_launch, p, stream);
}

template <int kBlockN, class YT, class ZT, int kAct>
void launch_typed(const KernelParams& p, Int8ConvKernel which, cudaStream_t stream) {
  if (which == Int8ConvKernel::kImplicitGemm) {
    auto kernel = implicit_gemm_kernel<kBlockN, YT, ZT, kAct>;
    const int smem = implicit_gemm_smem<kBlockN, YT, ZT>();
    prepare(kernel, smem);
    launch_blocks(kernel, static_cast<int64_t>(p.m_tiles) * (p.g.k / kBlockN) * p.k_splits, smem, p.k_splits, false, p, stream);
  } else if (which == Int8ConvKernel::kSmallM) {
    if constexpr (kBlockN != kSmallBlockN)
      throw Error(ErrorKind::kInternal, "kiln INT8 convolution: the small-M kernel's tile is 64");
    auto kernel = small_m_kernel<YT, ZT, kAct>;
    prepare(kernel, kSmallSmem);
    const int64_t blocks = static_cast<int64_t>(p.m_tiles) * ((p.g.k + kSmallBlockN - 1) / kSmallBlockN) * p.k_splits;
    launch_blocks(kernel, blocks, kSmallSmem, p.k_splits, p.programmatic_launch, p, stream);
  } else if constexpr (kAct < 2) {  // the stream kernel has no other activations
    if (p.g.c == 64) launch_stream<64, kBlockN, YT, ZT, kAct>(p, stream);
    else if (p.g.c == 128) launch_stream<128, kBlockN, YT, ZT, kAct>(p, stream);
    else launch_stream<256, kBlockN, YT, ZT, kAct>(p, stream);
  } else {
    throw Error(ErrorKind::kInternal, "kiln INT8 convolution: the stream kernel has no such activation");
  }
  KILN_CUDA_CHECK_LAUNCH();
}

template <int kBlockN, class YT, class ZT>
void launch_act(const KernelParams& p, Int8ConvKernel which, int act, cudaStream_t stream) {
  if (act == 0) launch_typed<kBlockN, YT, ZT, 0>(p, which, stream);
  else if (act == 1) launch_typed<kBlockN, YT, ZT, 1>(p, which, stream);
  else launch_typed<kBlockN, YT, ZT, 2>(p, which, stream);
}

template <int kBlockN, class YT>
void launch_z(const KernelParams& p, Int8ConvKernel which, int act, DType z_type, cudaStream_t stream) {
  if (z_type == DType::kInt8) launch_act<kBlockN, YT, int8_t>(p, which, act, stream);
  else if (z_type == DType::kFloat16) launch_act<kBlockN, YT, __half>(p, which, act, stream);
  else launch_act<kBlockN, YT, void>(p, which, act, stream);
}

template <int kBlockN>
void launch_y(const KernelParams& p, Int8ConvKernel which, int act, DType y_type, DType z_type, cudaStream_t stream) {
  if (y_type == DType::kInt8) launch_z<kBlockN, int8_t>(p, which, act, z_type, stream);
  else launch_z<kBlockN, __half>(p, which, act, z_type, stream);
}

// Shared memory the stream kernel needs for this geometry, whatever the types (the largest).
int stream_smem_bound(int c, int tile_n) {
  auto bound = [&](auto tile) {
    constexpr int kTile = decltype(tile)::value;
    return c == 64 ? stream_layout<64, kTile, __half, __half>().total
           : c == 128 ? stream_layout<128, kTile, __half, __half>().total
                      : stream_layout<256, kTile, __half, __half>().total;
  };
  return tile_n == 128 ? bound(std::integral_constant<int, 128>{}) : bound(std::integral_constant<int, 64>{});
}

}  // namespace

bool hopper_features() {
  static std::mutex mutex;
  static std::map<int, bool> known;
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(device);
  if (it == known.end()) {
    int major = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    it = known.emplace(device, major >= 9).first;
  }
  return it->second;
}

std::string Int8ConvTactic::str() const {
  const char* name = kernel == Int8ConvKernel::kImplicitGemm ? "implicit-gemm:"
                     : kernel == Int8ConvKernel::kSmallM     ? "small-m:"
                                                             : "stream1x1:";
  return std::string(name) + std::to_string(tile_n) +
         (k_splits > 1 ? "/k" + std::to_string(k_splits) : "");
}

bool Int8ConvTactic::parse(const std::string& text, Int8ConvTactic& tactic) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return false;
  const std::string name = text.substr(0, colon);
  if (name == "implicit-gemm") tactic.kernel = Int8ConvKernel::kImplicitGemm;
  else if (name == "stream1x1") tactic.kernel = Int8ConvKernel::kStream1x1;
  else if (name == "small-m") tactic.kernel = Int8ConvKernel::kSmallM;
  else return false;
  tactic.tile_n = std::atoi(text.c_str() + colon + 1);
  const size_t split = text.find("/k", colon);
  tactic.k_splits = split == std::string::npos ? 1 : std::atoi(text.c_str() + split + 2);
  const bool splittable = tactic.tile_n == 64 && tactic.kernel != Int8ConvKernel::kStream1x1;
  return (tactic.tile_n == 64 || (tactic.tile_n == 128 && tactic.kernel != Int8ConvKernel::kSmallM)) &&
         (tactic.k_splits == 1 || (splittable && (tactic.k_splits == 2 || tactic.k_splits == 4 || tactic.k_splits == 8)));
}

std::vector<Int8ConvTactic> int8_conv_tactics(const Int8ConvGeometry& g, DType y_type, DType z_type, const ir::Activation& act,
                                              int asked_splits, std::string* why) {
  auto refuse = [&](const std::string& reason) {
    if (why) *why = reason;
    return std::vector<Int8ConvTactic>{};
  };
  if (g.c % 16 != 0) return refuse("input channels must be a multiple of 16");
  if (g.k % 16 != 0) return refuse("output channels must be a multiple of 16");
  if (y_type != DType::kInt8 && y_type != DType::kFloat16) return refuse("the output must be int8 or float16");
  if (z_type != DType::kUndefined && z_type != DType::kInt8 && z_type != DType::kFloat16)
    return refuse("the residual must be int8 or float16");
  if ((g.batch * g.oh * g.ow + kBlockM) * g.k >= (int64_t{1} << 31) / 2 || int64_t{g.r} * g.s * g.c >= (int64_t{1} << 30))
    return refuse("too large for 32-bit element indices");
  std::vector<Int8ConvTactic> tactics;
  const bool one_by_one = g.r == 1 && g.s == 1 && g.pad_h == 0 && g.pad_w == 0 && g.dil_h == 1 && g.dil_w == 1;
  // Split K (below) only when asked: this runs on every launch (launch_int8_conv's check), so
  // the default path asks the device nothing.
  int sms = 0;
  if (asked_splits > 1) {
    int device = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  }
  const int64_t m_tiles = (g.batch * g.oh * g.ow + kBlockM - 1) / kBlockM;
  const int64_t k_tiles = (int64_t{g.r} * g.s * g.c + kBlockK - 1) / kBlockK;
  for (int tile : {64, 128}) {
    if (g.k % tile != 0) continue;
    tactics.push_back({Int8ConvKernel::kImplicitGemm, tile});
    // Split K where the tiles alone leave most multiprocessors idle and each split keeps at
    // least two stages of K (tile 64 only: its sums fit the pipeline's buffers). Offered only
    // when TacticOptions::int8_k_splits asks: timed alone they won 14 layers of ResNet-50 at batch 1, but
    // the engine that ran them was 10% slower than without (docs/design/int8.md, "Split K over a
    // cluster").
    for (int splits : {2, 4, 8})
      if (asked_splits == splits && tile == 64 && m_tiles * (g.k / tile) * 2 <= sms && k_tiles >= 2 * splits)
        tactics.push_back({Int8ConvKernel::kImplicitGemm, tile, splits});
    if (one_by_one && (g.c == 64 || g.c == 128 || g.c == 256) && (act.none() || act.kind == ir::ActivationKind::kRelu) &&
        stream_smem_bound(g.c, tile) <= 227 * 1024)
      tactics.push_back({Int8ConvKernel::kStream1x1, tile});
  }
  // The small-M kernel where a layer has few tiles of 64 x 64 (up to two per multiprocessor of an
  // H100; a fixed bound, so that this asks the device nothing; any multiple of 16 output
  // channels, the last tile partial), with K split 2, 4 or 8 ways where the split tiles still fit
  // and every split has a stage of K.
  const int64_t small_tiles =
      (g.batch * g.oh * g.ow + kSmallBlockM - 1) / kSmallBlockM * ((g.k + kSmallBlockN - 1) / kSmallBlockN);
  const int64_t small_k_tiles = (int64_t{g.r} * g.s * g.c + kSmallBlockK - 1) / kSmallBlockK;
  if (small_tiles <= kSmallMaxBlocks) {
    tactics.push_back({Int8ConvKernel::kSmallM, kSmallBlockN});
    for (int splits : {2, 4, 8})
      if (small_tiles * splits <= kSmallMaxBlocks && small_k_tiles >= splits)
        tactics.push_back({Int8ConvKernel::kSmallM, kSmallBlockN, splits});
  }
  if (tactics.empty()) return refuse("output channels must be a multiple of 64, or the layer have few output tiles");
  return tactics;
}

void launch_int8_conv(const Int8ConvGeometry& g, DType y_type, DType z_type, const Int8ConvArgs& args,
                      const ir::Activation& act, const Int8ConvTactic& tactic, cudaStream_t stream) {
  bool known = false;
  for (const Int8ConvTactic& t : int8_conv_tactics(g, y_type, z_type, act, tactic.k_splits))
    known = known || (t.kernel == tactic.kernel && t.tile_n == tactic.tile_n && t.k_splits == tactic.k_splits);
  if (!known) throw Error(ErrorKind::kInternal, "kiln INT8 convolution: tactic " + tactic.str() + " does not run this geometry");
  KernelParams p;
  p.g = g;
  p.a = args;
  p.act = act;
  p.programmatic_launch = args.programmatic_launch && hopper_features();
  p.inv_y_scale = args.y_scale > 0.f ? 1.f / args.y_scale : 0.f;
  p.m = static_cast<int>(g.batch * g.oh * g.ow);
  p.k_total = g.r * g.s * g.c;
  const bool small = tactic.kernel == Int8ConvKernel::kSmallM;
  p.k_tiles = (p.k_total + (small ? kSmallBlockK : kBlockK) - 1) / (small ? kSmallBlockK : kBlockK);
  p.m_tiles = (p.m + (small ? kSmallBlockM : kBlockM) - 1) / (small ? kSmallBlockM : kBlockM);
  p.k_splits = tactic.k_splits;
  p.split_tiles = (p.k_tiles + p.k_splits - 1) / p.k_splits;
  p.contiguous = g.r == 1 && g.s == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_h == 0 && g.pad_w == 0 && g.oh == g.h && g.ow == g.w;
  if (p.m == 0) return;
  const int act_kind = act.none() ? 0 : act.kind == ir::ActivationKind::kRelu ? 1 : 2;
  if (tactic.tile_n == 128) launch_y<128>(p, tactic.kernel, act_kind, y_type, z_type, stream);
  else launch_y<64>(p, tactic.kernel, act_kind, y_type, z_type, stream);
}

}  // namespace kiln::cuda
