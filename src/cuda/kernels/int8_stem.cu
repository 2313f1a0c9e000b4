// kiln's INT8 convolution for few input channels (see int8_stem.h).
//
// The GEMM of a block: rows are its 128 output pixels (8 rows x 16 columns of one image), columns
// its kBlockN output channels, the reduction k = tap * 4 + channel over the taps rounded up to a
// multiple of 8 (32 bytes: one m16n8k32 step). 8 warps, 4 along M (32 pixels each) and 2 along N.
// The A fragment registers of m16n8k32 hold 4 consecutive k bytes of one row, which here is one
// tap of one pixel: one 32-bit shared-memory load from the patch at (pixel's corner + tap's
// offset). Taps beyond r * s have zero weights, so what A reads there does not matter (offset 0).
// Blocks are persistent over the pixel tiles of their column block: the weights, multipliers
// and biases are loaded once.
#include "cuda/kernels/int8_stem.h"

#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/kernels/common.cuh"
#include "cuda/kernels/int8_epilogue.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

using namespace int8_epilogue;

constexpr int kTileH = 8, kTileW = 16, kBlockM = kTileH * kTileW;
constexpr int kThreads = 256;
constexpr int kMaxTaps = 64;
constexpr int kWordsPerThread = 4;  // patch words a thread fetches ahead (a 7x7 stride-2 patch is 777)
constexpr int kRowPad = 16;  // bytes after each weight row and output-tile row (bank spread)

struct StemParams {
  Int8ConvGeometry g;
  Int8ConvArgs a;
  ir::Activation act;
  float inv_y_scale;
  int k_steps;            // 32-byte reduction steps: taps rounded up to 8, / 8
  int patch_h, patch_w;   // the input patch under an output tile
  int tiles_h, tiles_w;   // output tiles per image
  int64_t tiles;          // output tiles in all
  // Shared-memory layout (byte offsets, 16-byte aligned).
  int w_pitch, patch_at, taps_at, vectors_at, y_at, smem;
};

__device__ __forceinline__ void mma_s8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int kBlockN, class YT, int kAct>
__global__ void __launch_bounds__(kThreads, 3) stem_kernel(const StemParams p) {
  constexpr int kTilesN = kBlockN / 16;  // n8 tiles per warp (two warps along N)
  constexpr int kYPitch = kBlockN * static_cast<int>(sizeof(YT)) + kRowPad;
  extern __shared__ __align__(16) uint8_t smem[];
  const Int8ConvGeometry& g = p.g;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp & 3, warp_n = warp >> 2;
  const int group = lane >> 2, quad = lane & 3;
  const int n_base = static_cast<int>(blockIdx.y) * kBlockN;

  uint8_t* w_s = smem;
  uint32_t* patch = reinterpret_cast<uint32_t*>(smem + p.patch_at);
  int* tap_at = reinterpret_cast<int*>(smem + p.taps_at);
  float* mult = reinterpret_cast<float*>(smem + p.vectors_at);
  float* bias = mult + kBlockN;
  uint8_t* y_tile = smem + p.y_at;

  // Once per block: weights, the word offset of each tap in the patch, the epilogue vectors.
  const int row_bytes = p.k_steps * 32;
  for (int i = tid; i < kBlockN * (row_bytes / 16); i += kThreads) {
    const int n = i / (row_bytes / 16), chunk = i % (row_bytes / 16);
    *reinterpret_cast<uint4*>(w_s + n * p.w_pitch + chunk * 16) =
        __ldg(reinterpret_cast<const uint4*>(p.a.w + static_cast<int64_t>(n_base + n) * row_bytes + chunk * 16));
  }
  for (int t = tid; t < p.k_steps * 8; t += kThreads)
    tap_at[t] = t < g.r * g.s ? (t / g.s) * g.dil_h * p.patch_w + (t % g.s) * g.dil_w : 0;
  for (int i = tid; i < kBlockN; i += kThreads) {
    mult[i] = p.a.mult[n_base + i];
    bias[i] = p.a.bias ? p.a.bias[n_base + i] : 0.f;
  }
  // The patch word of this thread's four A rows' pixels (tap 0).
  int pixel_at[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = warp_m * 32 + mt * 16 + half * 8 + group;
      pixel_at[mt][half] = (m / kTileW) * g.stride_h * p.patch_w + (m % kTileW) * g.stride_w;
    }

  // The patch is loaded through registers one tile ahead: the next tile's bytes are in flight
  // while this tile's products, epilogue and stores run (a first version that loaded, waited
  // and computed took 0.24 ms for ResNet-50's stem at batch 128 on an H100, bound by the loads'
  // latency; docs/design/int8.md, "The image stem and the int8 MaxPool").
  const int64_t plane = static_cast<int64_t>(g.h) * g.w;
  const int patch_words = p.patch_h * p.patch_w;
  uint8_t next[kWordsPerThread][4];
  // The patch row and column of this thread's words of a one-fetch patch: the same for every tile.
  int word_h[kWordsPerThread], word_w[kWordsPerThread];
#pragma unroll
  for (int j = 0; j < kWordsPerThread; ++j) word_h[j] = (j * kThreads + tid) / p.patch_w, word_w[j] = (j * kThreads + tid) % p.patch_w;
  auto fetch = [&](int64_t tile, int first_word) {
    const int64_t image = tile / (p.tiles_h * p.tiles_w);
    const int rem = static_cast<int>(tile - image * p.tiles_h * p.tiles_w);
    const int ih0 = rem / p.tiles_w * kTileH * g.stride_h - g.pad_h, iw0 = rem % p.tiles_w * kTileW * g.stride_w - g.pad_w;
    const int8_t* x = p.a.x + image * g.c * plane;
#pragma unroll
    for (int j = 0; j < kWordsPerThread; ++j) {
      const int i = first_word + j * kThreads + tid;
      const int ih = ih0 + (first_word ? i / p.patch_w : word_h[j]), iw = iw0 + (first_word ? i % p.patch_w : word_w[j]);
      const bool inside = i < patch_words && ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
      const int8_t* at = x + ih * g.w + iw;
#pragma unroll
      for (int c = 0; c < 4; ++c) next[j][c] = inside && c < g.c ? static_cast<uint8_t>(__ldg(at + c * plane)) : uint8_t{0};
    }
  };
  // Writes the fetched words (one word per input pixel, its channels in bytes 0..c-1, zeros
  // elsewhere and outside the image) into the patch.
  auto put = [&](int first_word) {
#pragma unroll
    for (int j = 0; j < kWordsPerThread; ++j) {
      const int i = first_word + j * kThreads + tid;
      if (i < patch_words)
        patch[i] = next[j][0] | uint32_t{next[j][1]} << 8 | uint32_t{next[j][2]} << 16 | uint32_t{next[j][3]} << 24;
    }
  };
  // Patches larger than one fetch (long strides or dilations) are loaded in several, without
  // the overlap.
  const bool one_fetch = patch_words <= kWordsPerThread * kThreads;
  if (one_fetch && blockIdx.x < p.tiles) fetch(blockIdx.x, 0);
  for (int64_t tile = blockIdx.x; tile < p.tiles; tile += gridDim.x) {
    const int64_t image = tile / (p.tiles_h * p.tiles_w);
    const int rem = static_cast<int>(tile - image * p.tiles_h * p.tiles_w);
    const int oh0 = rem / p.tiles_w * kTileH, ow0 = rem % p.tiles_w * kTileW;
    if (one_fetch) {
      put(0);
      if (tile + gridDim.x < p.tiles) fetch(tile + gridDim.x, 0);
    } else {
      for (int first = 0; first < patch_words; first += kWordsPerThread * kThreads) {
        fetch(tile, first);
        put(first);
      }
    }
    __syncthreads();  // the patch is in; the last tile's output tile has been stored

    int acc[2][kTilesN][4] = {};
#pragma unroll 2
    for (int ks = 0; ks < p.k_steps; ++ks) {
      const int t0 = tap_at[ks * 8 + quad], t1 = tap_at[ks * 8 + 4 + quad];
      uint32_t a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        a[mt][0] = patch[pixel_at[mt][0] + t0];
        a[mt][1] = patch[pixel_at[mt][1] + t0];
        a[mt][2] = patch[pixel_at[mt][0] + t1];
        a[mt][3] = patch[pixel_at[mt][1] + t1];
      }
#pragma unroll
      for (int nt = 0; nt < kTilesN; ++nt) {
        const uint8_t* b = w_s + (warp_n * (kBlockN / 2) + nt * 8 + group) * p.w_pitch + ks * 32 + quad * 4;
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(b), b1 = *reinterpret_cast<const uint32_t*>(b + 16);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) mma_s8(acc[mt][nt], a[mt], b0, b1);
      }
    }

#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt) {
      const int col = warp_n * (kBlockN / 2) + nt * 8 + quad * 2;
      const float2 m2 = make_float2(mult[col], mult[col + 1]), b2 = make_float2(bias[col], bias[col + 1]);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = warp_m * 32 + mt * 16 + half * 8 + group;
          epilogue_pair<YT, void, kAct>(acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1], m2, b2, nullptr, 1.f,
                                        y_tile + row * kYPitch + col * static_cast<int>(sizeof(YT)), p.inv_y_scale, p.act);
        }
    }
    __syncthreads();  // the output tile is complete; every warp is done with the patch

    constexpr int kChunks = kBlockN * static_cast<int>(sizeof(YT)) / 16;
    uint8_t* y = static_cast<uint8_t*>(p.a.y);
    for (int i = tid; i < kBlockM * kChunks; i += kThreads) {
      const int row = i / kChunks, chunk = i % kChunks;
      const int oh = oh0 + row / kTileW, ow = ow0 + row % kTileW;
      if (oh < g.oh && ow < g.ow) {
        const int64_t pixel = (image * g.oh + oh) * g.ow + ow;
        *reinterpret_cast<uint4*>(y + (pixel * g.k + n_base) * static_cast<int64_t>(sizeof(YT)) + chunk * 16) =
            *reinterpret_cast<const uint4*>(y_tile + row * kYPitch + chunk * 16);
      }
    }
  }
}

int block_n(int k) { return k % 64 == 0 ? 64 : k % 32 == 0 ? 32 : 16; }

int round16(int v) { return (v + 15) / 16 * 16; }

template <int kBlockN, class YT, int kAct>
void launch_typed(StemParams p, cudaStream_t stream) {
  auto kernel = stem_kernel<kBlockN, YT, kAct>;
  // All of L1 as shared memory, as kiln's other INT8 kernels and cuDNN's take it.
  const KernelOccupancy info = prepare_kernel(kernel, kThreads, p.smem, /*all_shared=*/true, "kiln INT8 stem convolution");
  const int n_blocks = p.g.k / kBlockN;
  const int64_t columns = std::clamp<int64_t>(int64_t{info.blocks_per_sm} * info.sms / n_blocks, 1, p.tiles);
  kernel<<<dim3(static_cast<unsigned>(columns), static_cast<unsigned>(n_blocks)), kThreads, p.smem, stream>>>(p);
  KILN_CUDA_CHECK_LAUNCH();
}

template <int kBlockN, class YT>
void launch_act(const StemParams& p, int act, cudaStream_t stream) {
  if (act == 0) launch_typed<kBlockN, YT, 0>(p, stream);
  else if (act == 1) launch_typed<kBlockN, YT, 1>(p, stream);
  else launch_typed<kBlockN, YT, 2>(p, stream);
}

template <class YT>
void launch_n(const StemParams& p, int act, cudaStream_t stream) {
  const int n = block_n(p.g.k);
  if (n == 64) launch_act<64, YT>(p, act, stream);
  else if (n == 32) launch_act<32, YT>(p, act, stream);
  else launch_act<16, YT>(p, act, stream);
}

StemParams make_params(const Int8ConvGeometry& g, DType y_type) {
  StemParams p{};
  p.g = g;
  p.k_steps = (g.r * g.s + 7) / 8;
  p.patch_h = (kTileH - 1) * g.stride_h + (g.r - 1) * g.dil_h + 1;
  p.patch_w = (kTileW - 1) * g.stride_w + (g.s - 1) * g.dil_w + 1;
  p.tiles_h = (g.oh + kTileH - 1) / kTileH;
  p.tiles_w = (g.ow + kTileW - 1) / kTileW;
  p.tiles = g.batch * p.tiles_h * p.tiles_w;
  const int n = block_n(g.k), y_bytes = y_type == DType::kInt8 ? 1 : 2;
  p.w_pitch = p.k_steps * 32 + kRowPad;
  int at = n * p.w_pitch;
  p.patch_at = at, at += round16(p.patch_h * p.patch_w * 4);
  p.taps_at = at, at += round16(p.k_steps * 8 * 4);
  p.vectors_at = at, at += round16(2 * n * 4);
  p.y_at = at, at += kBlockM * (n * y_bytes + kRowPad);
  p.smem = at;
  return p;
}

}  // namespace

bool int8_stem_supported(const Int8ConvGeometry& g, DType y_type, DType z_type, std::string* why) {
  auto refuse = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (g.c < 1 || g.c > 4) return refuse("the stem kernel takes 1 to 4 input channels");
  if (g.k % 16 != 0) return refuse("output channels must be a multiple of 16");
  if (g.r * g.s > kMaxTaps) return refuse("the stem kernel takes filters of at most 64 taps");
  if (y_type != DType::kInt8 && y_type != DType::kFloat16) return refuse("the output must be int8 or float16");
  if (z_type != DType::kUndefined) return refuse("the stem kernel has no residual input");
  if (make_params(g, y_type).smem > 200 * 1024) return refuse("the input patch of a tile is too large (stride or dilation)");
  return true;
}

void launch_int8_stem(const Int8ConvGeometry& g, DType y_type, const Int8ConvArgs& args, const ir::Activation& act,
                      cudaStream_t stream) {
  std::string why;
  if (!int8_stem_supported(g, y_type, DType::kUndefined, &why)) throw Error(ErrorKind::kInternal, "kiln INT8 stem convolution: " + why);
  StemParams p = make_params(g, y_type);
  p.a = args;
  p.act = act;
  p.inv_y_scale = args.y_scale > 0.f ? 1.f / args.y_scale : 0.f;
  if (p.tiles == 0) return;
  const int act_kind = act.none() ? 0 : act.kind == ir::ActivationKind::kRelu ? 1 : 2;
  if (y_type == DType::kInt8) launch_n<int8_t>(p, act_kind, stream);
  else launch_n<__half>(p, act_kind, stream);
}

std::vector<int8_t> stem_weights(const int8_t* w, int k, int c, int r, int s) {
  const int taps = (r * s + 7) / 8 * 8;
  std::vector<int8_t> out(static_cast<size_t>(k) * taps * 4, 0);
  for (int m = 0; m < k; ++m)
    for (int ch = 0; ch < c; ++ch)
      for (int t = 0; t < r * s; ++t)
        out[(static_cast<size_t>(m) * taps + t) * 4 + ch] = w[(static_cast<size_t>(m) * c + ch) * r * s + t];
  return out;
}

}  // namespace kiln::cuda
