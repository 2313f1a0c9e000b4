// The fused attention kernel (flash_attention.h). One block of 4 or 8 warps (a tactic the layer
// times) takes 64 or 128 queries of one head; each warp holds 16 of them. The block walks the
// keys in tiles of 64, loading the next tile's K and V (cp.async, double-buffered in shared
// memory) while it computes on the current:
//   S = Q K^T          mma.sync m16n8k16, float16 in, float32 accumulators; Q's fragments stay
//                      in registers for the whole walk
//   online softmax     per query row, in the base-2 domain (scale * log2(e) folded in), the row's
//                      maximum and sum kept across tiles, O rescaled when the maximum grows
//   O += P V           P rounded to float16 straight from S's accumulators (an m16n8 accumulator
//                      pair is an m16n8k16 A fragment), V read transposed by ldmatrix
// Shared memory rows are 128 bytes (64 halves); their 16-byte chunks are XOR-swizzled by the
// row so that ldmatrix's eight rows fall in eight different banks.
// Work the shapes do not need is skipped: key sub-tiles of 16 past the last key (ViT's 197 keys
// take 208 columns, not 256), the warps whose 16 queries are all past the last query, and under a
// causal mask the key tiles past the block's last query.
#include "cuda/kernels/flash_attention.h"

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "cuda/kernels/quantize_elements.cuh"

namespace kiln::cuda {

namespace {

constexpr int kHead = 64;                // head size
constexpr int kBlockKeys = 64;           // keys a tile
constexpr int kTileHalves = 64 * kHead;  // one tile of K or V
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Offset in halves of 16-byte chunk `chunk` (0-7) of row `row` in a swizzled tile.
__device__ __forceinline__ int swizzled(int row, int chunk) { return row * kHead + ((chunk ^ (row & 7)) << 3); }

// 16 bytes from global to shared memory, or zeros where `valid` is false (rows past the sequence:
// zeros keep P V free of whatever lies past the end).
__device__ __forceinline__ void copy16(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copies_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void copies_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_transposed(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a b for one m16n8k16 tile.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_halves(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

struct Args {
  FlashAttentionProblem p;
  float scale_log2;  // scale * log2(e)
  float inv_scale;   // 1 / scale: a mask value joins the unscaled logits as mask / scale
};

// Rows [row0, row0 + kRowsInTile) of a [rows, 64] matrix into a swizzled tile: each thread moves
// the 16-byte chunks threadIdx.x + kThreadsInBlock * n of the tile.
template <int kRowsInTile, int kThreadsInBlock>
__device__ __forceinline__ void load_rows(__half* tile, const __half* base, int64_t row_stride, int row0, int rows) {
#pragma unroll
  for (int n = 0; n < kRowsInTile * 8 / kThreadsInBlock; ++n) {
    const int i = static_cast<int>(threadIdx.x) + kThreadsInBlock * n;
    const int r = i >> 3, c = i & 7;
    const bool valid = row0 + r < rows;
    const __half* src = valid ? base + int64_t{row0 + r} * row_stride + c * 8 : base;
    copy16(tile + swizzled(r, c), src, valid);
  }
}

// kWarps warps of 16 queries each; kMask: a mask input (kBoolean: bool, else additive float32);
// kInt8: Y is int8.
template <int kWarps, bool kMask, bool kBoolean, bool kInt8>
__global__ void __launch_bounds__(32 * kWarps) flash_attention_kernel(Args a) {
  constexpr int kBlockThreads = 32 * kWarps;
  constexpr int kQueries = 16 * kWarps;
  __shared__ __align__(128) __half q_tile[kQueries * kHead];
  __shared__ __align__(128) __half k_tiles[2][kTileHalves];
  __shared__ __align__(128) __half v_tiles[2][kTileHalves];

  const FlashAttentionProblem& p = a.p;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int g = lane >> 2, t = lane & 3;  // an accumulator's row within 8, column pair within 8
  const int queries = static_cast<int>(p.queries), keys = static_cast<int>(p.keys);
  const int q0 = static_cast<int>(blockIdx.x) * kQueries;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t kv_h = h / (p.q_heads / p.kv_heads);
  const __half* q = static_cast<const __half*>(p.q) + b * p.q_strides[0] + h * p.q_strides[1];
  const __half* k = static_cast<const __half*>(p.k) + b * p.k_strides[0] + kv_h * p.k_strides[1];
  const __half* v = static_cast<const __half*>(p.v) + b * p.v_strides[0] + kv_h * p.v_strides[1];

  // Keys this block reads: under a causal mask none past its last query.
  const int key_end = p.causal ? min(q0 + kQueries, keys) : keys;
  const int tiles = (key_end + kBlockKeys - 1) / kBlockKeys;

  load_rows<kQueries, kBlockThreads>(q_tile, q, p.q_strides[2], q0, queries);
  if (tiles > 0) {
    load_rows<kBlockKeys, kBlockThreads>(k_tiles[0], k, p.k_strides[2], 0, keys);
    load_rows<kBlockKeys, kBlockThreads>(v_tiles[0], v, p.v_strides[2], 0, keys);
  }
  copies_commit();

  const int warp_row0 = q0 + warp * 16;
  const int row_lo = warp_row0 + g, row_hi = row_lo + 8;  // this thread's two query rows
  const bool active = warp_row0 < queries;                 // the warp has a query to compute
  const char* mask_lo = nullptr;
  const char* mask_hi = nullptr;
  if constexpr (kMask) {
    const int64_t element = kBoolean ? 1 : 4;
    const int64_t base = b * p.mask_strides[0] + h * p.mask_strides[1];
    mask_lo = static_cast<const char*>(p.mask) + (base + min(row_lo, queries - 1) * p.mask_strides[2]) * element;
    mask_hi = static_cast<const char*>(p.mask) + (base + min(row_hi, queries - 1) * p.mask_strides[2]) * element;
  }

  uint32_t q_frag[4][4];
  float o[8][4] = {};
  float max_lo = -INFINITY, max_hi = -INFINITY, sum_lo = 0.f, sum_hi = 0.f;

  for (int tile = 0; tile < tiles; ++tile) {
    if (tile + 1 < tiles) {
      load_rows<kBlockKeys, kBlockThreads>(k_tiles[(tile + 1) & 1], k, p.k_strides[2], (tile + 1) * kBlockKeys, keys);
      load_rows<kBlockKeys, kBlockThreads>(v_tiles[(tile + 1) & 1], v, p.v_strides[2], (tile + 1) * kBlockKeys, keys);
      copies_commit();
      copies_wait<1>();
    } else {
      copies_wait<0>();
    }
    __syncthreads();
    if (active) {
      if (tile == 0) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          ldmatrix_x4(q_frag[kk], shared_address(q_tile + swizzled(warp * 16 + (lane & 15), kk * 2 + (lane >> 4))));
      }
      const __half* kt = k_tiles[tile & 1];
      const __half* vt = v_tiles[tile & 1];
      const int n0 = tile * kBlockKeys;
      // Sub-tiles of 16 keys holding at least one key.
      const int chunks = min(4, (key_end - n0 + 15) / 16);

      float s[8][4];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
      for (int pair = 0; pair < 4; ++pair) {
        // A guard, not a break: the loops stay unrolled and s[] in registers.
        if (pair < chunks) {
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            uint32_t kf[4];
            const int mi = lane >> 3;
            ldmatrix_x4(kf, shared_address(kt + swizzled(pair * 16 + ((mi >> 1) << 3) + (lane & 7), kk * 2 + (mi & 1))));
            mma(s[2 * pair], q_frag[kk], kf[0], kf[1]);
            mma(s[2 * pair + 1], q_frag[kk], kf[2], kf[3]);
          }
        }
      }

      // Hidden keys' logits become -inf, a float mask joins as mask / scale: only in tiles that
      // need it (the last tile, the causal diagonal, any tile under a mask).
      const bool checked = kMask || n0 + kBlockKeys > keys || (p.causal && n0 + kBlockKeys - 1 > warp_row0);
      if (checked) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = n0 + nt * 8 + 2 * t + e;
            const bool beyond = j >= keys;
            bool hide_lo = beyond || (p.causal && j > row_lo), hide_hi = beyond || (p.causal && j > row_hi);
            if constexpr (kMask) {
              if (j >= p.mask_keys) {
                hide_lo = hide_hi = true;
              } else if (!beyond) {
                const int64_t at = j * p.mask_strides[3];
                if constexpr (kBoolean) {
                  const bool keep_lo = reinterpret_cast<const bool*>(mask_lo)[at];
                  hide_lo = hide_lo || !keep_lo;
                  hide_hi = hide_hi || !(mask_hi == mask_lo ? keep_lo : reinterpret_cast<const bool*>(mask_hi)[at]);
                } else {
                  // A mask broadcast over the queries (BERT's [batch, 1, 1, keys]) is read once.
                  const float m_lo = reinterpret_cast<const float*>(mask_lo)[at];
                  const float m_hi = mask_hi == mask_lo ? m_lo : reinterpret_cast<const float*>(mask_hi)[at];
                  // -inf hides the key. Other values are held above -1e30 first: the most
                  // negative floats (float32's lowest, as some exporters mask) would overflow to
                  // -inf in the base-2 domain, where the CPU engine adds them as they are (a row
                  // masked that way everywhere is uniform there).
                  hide_lo = hide_lo || m_lo == -INFINITY;
                  hide_hi = hide_hi || m_hi == -INFINITY;
                  s[nt][e] = fmaf(fmaxf(m_lo, -1e30f), a.inv_scale, s[nt][e]);
                  s[nt][2 + e] = fmaf(fmaxf(m_hi, -1e30f), a.inv_scale, s[nt][2 + e]);
                }
              }
            }
            if (hide_lo) s[nt][e] = -INFINITY;
            if (hide_hi) s[nt][2 + e] = -INFINITY;
          }
        }
      }

      // Online softmax over this tile, on the unscaled logits (scale > 0): the maximum first,
      // then exp2(s * scale log2(e) - maximum * scale log2(e)), one FMA and one ex2 a value.
      float tile_max_lo = -INFINITY, tile_max_hi = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        tile_max_lo = fmaxf(tile_max_lo, fmaxf(s[nt][0], s[nt][1]));
        tile_max_hi = fmaxf(tile_max_hi, fmaxf(s[nt][2], s[nt][3]));
      }
      const float new_max_lo = fmaxf(max_lo, quad_max(tile_max_lo) * a.scale_log2);
      const float new_max_hi = fmaxf(max_hi, quad_max(tile_max_hi) * a.scale_log2);
      // A row with every key so far hidden keeps a maximum of -inf: subtract 0 instead (its
      // probabilities are exp2(-inf) = 0).
      const float base_lo = new_max_lo == -INFINITY ? 0.f : new_max_lo;
      const float base_hi = new_max_hi == -INFINITY ? 0.f : new_max_hi;
      const float rescale_lo = exp2_approx(max_lo - base_lo), rescale_hi = exp2_approx(max_hi - base_hi);
      max_lo = new_max_lo;
      max_hi = new_max_hi;
      sum_lo *= rescale_lo;
      sum_hi *= rescale_hi;
#pragma unroll
      for (int dt = 0; dt < 8; ++dt) {
        o[dt][0] *= rescale_lo;
        o[dt][1] *= rescale_lo;
        o[dt][2] *= rescale_hi;
        o[dt][3] *= rescale_hi;
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        s[nt][0] = exp2_approx(fmaf(s[nt][0], a.scale_log2, -base_lo));
        s[nt][1] = exp2_approx(fmaf(s[nt][1], a.scale_log2, -base_lo));
        s[nt][2] = exp2_approx(fmaf(s[nt][2], a.scale_log2, -base_hi));
        s[nt][3] = exp2_approx(fmaf(s[nt][3], a.scale_log2, -base_hi));
        sum_lo += s[nt][0] + s[nt][1];
        sum_hi += s[nt][2] + s[nt][3];
      }

      // O += P V, 16 keys a step.
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if (kk >= chunks) continue;
        const uint32_t pf[4] = {pack_halves(s[2 * kk][0], s[2 * kk][1]), pack_halves(s[2 * kk][2], s[2 * kk][3]),
                                pack_halves(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack_halves(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < 4; ++dp) {
          uint32_t vf[4];
          const int mi = lane >> 3;
          ldmatrix_x4_transposed(vf, shared_address(vt + swizzled(kk * 16 + ((mi & 1) << 3) + (lane & 7), dp * 2 + (mi >> 1))));
          mma(o[2 * dp], pf, vf[0], vf[1]);
          mma(o[2 * dp + 1], pf, vf[2], vf[3]);
        }
      }
    }
    __syncthreads();  // the next iteration loads into the buffer just read
  }

  if (!active) return;
  sum_lo = quad_sum(sum_lo);
  sum_hi = quad_sum(sum_hi);
  // A row whose keys are all hidden gives zeros.
  const float inv_lo = sum_lo > 0.f ? 1.f / sum_lo : 0.f, inv_hi = sum_hi > 0.f ? 1.f / sum_hi : 0.f;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = half ? row_hi : row_lo;
    if (row >= queries) continue;
    const float inv = half ? inv_hi : inv_lo;
    const int64_t at = b * p.y_strides[0] + h * p.y_strides[1] + row * p.y_strides[2] + 2 * t;
#pragma unroll
    for (int dt = 0; dt < 8; ++dt) {
      const float y0 = o[dt][2 * half] * inv, y1 = o[dt][2 * half + 1] * inv;
      if constexpr (kInt8) {
        // QuantizeLinear's arithmetic (quantize_elements.cuh).
        auto quantize = [&](float y) {
          const float zero = static_cast<float>(p.y_zero_point);
          return static_cast<signed char>(quantized_value(y, p.y_scale, zero, -128.f, 127.f));
        };
        char2 packed;
        packed.x = quantize(y0);
        packed.y = quantize(y1);
        *reinterpret_cast<char2*>(static_cast<int8_t*>(p.y) + at + dt * 8) = packed;
      } else {
        *reinterpret_cast<__half2*>(static_cast<__half*>(p.y) + at + dt * 8) = __floats2half2_rn(y0, y1);
      }
    }
  }
}

template <int kWarps, bool kMask, bool kBoolean>
cudaError_t launch_typed(const Args& a, cudaStream_t stream) {
  constexpr int kQueries = 16 * kWarps;
  const dim3 grid(static_cast<unsigned>((a.p.queries + kQueries - 1) / kQueries), static_cast<unsigned>(a.p.q_heads),
                  static_cast<unsigned>(a.p.batch));
  if (a.p.y_int8) flash_attention_kernel<kWarps, kMask, kBoolean, true><<<grid, 32 * kWarps, 0, stream>>>(a);
  else flash_attention_kernel<kWarps, kMask, kBoolean, false><<<grid, 32 * kWarps, 0, stream>>>(a);
  return cudaGetLastError();
}

template <int kWarps>
cudaError_t launch_with(const Args& a, cudaStream_t stream) {
  if (!a.p.mask) return launch_typed<kWarps, false, false>(a, stream);
  if (a.p.mask_boolean) return launch_typed<kWarps, true, true>(a, stream);
  return launch_typed<kWarps, true, false>(a, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

std::string flash_attention_unsupported(const FlashAttentionProblem& p) {
  if (p.head_size != kHead) return "kiln's fused attention takes a head size of 64, not " + std::to_string(p.head_size);
  if (p.block_warps != 4 && p.block_warps != 8) return "kiln's fused attention runs blocks of 4 or 8 warps";
  if (p.batch < 1 || p.q_heads < 1 || p.kv_heads < 1 || p.queries < 1 || p.keys < 1)
    return "kiln's fused attention takes no empty dimension";
  if (p.q_heads % p.kv_heads != 0) return "query heads are not a multiple of key/value heads";
  if (p.batch > 65535 || p.q_heads > 65535 || p.queries > (int64_t{1} << 30) || p.keys > (int64_t{1} << 30))
    return "kiln's fused attention: more batches, heads, queries or keys than its grid and indices hold";
  if (!(p.scale > 1e-30f) || !std::isfinite(p.scale))
    return "kiln's fused attention takes a positive, finite scale";
  // cp.async moves 16 bytes: every row of Q, K and V starts 16-byte aligned.
  for (const int64_t* s : {p.q_strides, p.k_strides, p.v_strides})
    for (int i = 0; i < 3; ++i)
      if (s[i] % 8 != 0) return "kiln's fused attention needs Q, K and V rows 16-byte aligned";
  // Outputs are written two values at a time.
  for (int i = 0; i < 3; ++i)
    if (p.y_strides[i] % 2 != 0) return "kiln's fused attention writes pairs: its output's strides must be even";
  if (p.mask && p.mask_keys > p.keys) return "the mask covers more keys than there are";
  if (p.y_int8 && !(p.y_scale > 0.f && std::isfinite(p.y_scale))) return "an int8 output needs a positive, finite scale";
  return "";
}

cudaError_t launch_flash_attention(const FlashAttentionProblem& p, cudaStream_t stream) {
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) ||
      reinterpret_cast<uintptr_t>(p.y) % (p.y_int8 ? 2 : 4) != 0)
    return cudaErrorMisalignedAddress;
  const Args a{p, p.scale * kLog2e, 1.f / p.scale};
  switch (p.block_warps) {
    case 4: return launch_with<4>(a, stream);
    case 8: return launch_with<8>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kiln::cuda
