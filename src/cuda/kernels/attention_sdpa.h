// cuDNN's fused flash attention (its SDPA graph, through the cuDNN frontend) as a tactic of the
// Attention layer (attention.cu). Built from attention_sdpa.cc where CMake found the frontend's
// headers, else from attention_sdpa_absent.cc, whose plans always say why not.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

struct cudnnContext;

namespace kiln::cuda {

struct SdpaDims {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, queries = 0, keys = 0, head_size = 0, v_head_size = 0;
  // Element strides over [batch, heads, sequence, size] of Q, K, V and the output.
  int64_t q_strides[4] = {}, k_strides[4] = {}, v_strides[4] = {}, o_strides[4] = {};
  // An additive float16 bias [bias_batch, bias_heads, queries, keys], contiguous (bias_batch is
  // 1 or batch, bias_heads 1 or q_heads), or none.
  bool bias = false;
  int64_t bias_batch = 1, bias_heads = 1;
  bool causal = false;  // key j hidden from query i when j > i
  float scale = 1.f;
};

class SdpaPlan {
 public:
  // The plan for float16 Q, K, V and output on this GPU, or nullptr with `why` set when cuDNN
  // cannot run it (head sizes, strides, this cuDNN's support).
  static std::unique_ptr<SdpaPlan> create(const SdpaDims& dims, cudnnContext* handle, std::string& why);
  ~SdpaPlan();
  size_t workspace_bytes() const;
  // Enqueues on the handle's stream.
  void run(cudnnContext* handle, const void* q, const void* k, const void* v, const void* bias, void* out,
           void* workspace) const;

 private:
  struct Impl;
  explicit SdpaPlan(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cuda
