// kiln's fused attention kernel: Y = softmax(scale * Q K^T + mask) V for float16 Q, K and V of
// head size 64, the logits never leaving the chip (flash attention: one pass over the keys, an
// online maximum and sum per query, tensor-core products). It writes float16 or int8 (the
// attention's output already quantized for an INT8 product after it), reads a padding mask where
// it lies (no bias tensor written first), and skips the padding of a last, partial tile of keys.
// The Attention layer (layers/attention.cu) times it against cuDNN's fused attention and the
// unfused products.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace kiln::cuda {

struct FlashAttentionProblem {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, queries = 0, keys = 0, head_size = 0;
  // Element strides over [batch, head, sequence] of Q, K, V and Y (the head axis contiguous).
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* y = nullptr;
  int64_t q_strides[3] = {}, k_strides[3] = {}, v_strides[3] = {}, y_strides[3] = {};
  float scale = 1.f;
  bool causal = false;  // key j hidden from query i when j > i
  // Y's type: float16, or int8 as round(Y / y_scale) + y_zero_point saturated (float32
  // division, round half to even: what QuantizeLinear computes).
  bool y_int8 = false;
  float y_scale = 1.f;
  int y_zero_point = 0;
  // An additive float32 mask or a boolean one (false hides the key), element strides over
  // [batch, q_heads, queries, keys] (0 where it broadcasts); keys from mask_keys on are hidden.
  const void* mask = nullptr;
  bool mask_boolean = false;
  int64_t mask_strides[4] = {};
  int64_t mask_keys = 0;
  // Warps a block (16 queries each): 4 or 8, a tactic the layer times.
  int block_warps = 4;
};

// Empty where the kernel runs the problem, else why not (head size, strides, sizes); the
// pointers are not looked at.
std::string flash_attention_unsupported(const FlashAttentionProblem& problem);

// Enqueues the kernel; the launch's error, if any: cudaErrorMisalignedAddress where Q, K or V is
// not 16-byte aligned, or Y not aligned to two of its elements.
cudaError_t launch_flash_attention(const FlashAttentionProblem& problem, cudaStream_t stream);

}  // namespace kiln::cuda
