// ONNX Attention (opset 23 on): scaled dot-product attention with grouped KV heads, a past KV
// cache, masks (additive or boolean), causal and sliding-window masking, padding by
// nonpad_kv_seqlen, a soft cap on the logits. What every backend derives the same way from the
// node and its input shapes lives here: the shapes, the scale, and the bias that masks add.
//
// Semantics (onnx's reference, onnx/reference/ops/op_attention.py):
//   3-D inputs [batch, seq, heads * size] are split into heads (q_num_heads, kv_num_heads);
//   keys and values are the past ones followed by the new ones (present_key/value outputs);
//   logits = (Q * sqrt(scale)) . (K * sqrt(scale))^T, scale 1/sqrt(head size) unless given;
//   softcap > 0: logits = softcap * tanh(logits / softcap);
//   bias = attn_mask (boolean: false -> -inf; shorter than the keys: padded masked)
//        + causal (-inf where key j > query i + offset) + sliding window + key padding;
//   probabilities = softmax(logits + bias) over the keys; a row whose bias is -inf everywhere
//   (no key may be attended) is all zeros; Y = probabilities . V, back to 3-D if Q was.
//   offset: past length with a past cache, nonpad_kv_seqlen[b] - q_seq with it, else 0.
//   A query head h reads key/value head h / (q_heads / kv_heads).
//   qk_matmul_output: mode 0 the logits before the soft cap (the spec's words; ONNX Runtime does
//   so, onnx's reference gives them after it), 1 after the cap, 2 with the bias, 3 the
//   probabilities.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

struct AttentionShape {
  bool three_d = false;
  int64_t batch = 0, q_heads = 0, kv_heads = 0;
  int64_t q_seq = 0, kv_seq = 0, past_seq = 0;  // kv_seq: the new keys; past_seq: the cache's
  int64_t head_size = 0, v_head_size = 0;
  int64_t total_kv() const { return past_seq + kv_seq; }
};

// The shapes from concrete input shapes (past_key empty when absent); `why` is set (and the
// result meaningless) when they contradict each other or the attributes.
inline AttentionShape attention_shape(const Node& node, const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                                      const std::vector<int64_t>& v, const std::vector<int64_t>& past_key,
                                      std::string& why) {
  AttentionShape s;
  why.clear();
  if (q.size() != k.size() || q.size() != v.size() || (q.size() != 3 && q.size() != 4)) {
    why = "Q, K and V must all be 3-D or all 4-D";
    return s;
  }
  s.three_d = q.size() == 3;
  s.batch = q[0];
  if (k[0] != s.batch || v[0] != s.batch) why = "Q, K and V must have the same batch";
  if (s.three_d) {
    s.q_heads = node.attrs.get_int("q_num_heads", 0);
    s.kv_heads = node.attrs.get_int("kv_num_heads", 0);
    if (s.q_heads <= 0 || s.kv_heads <= 0) {
      why = "3-D inputs need q_num_heads and kv_num_heads";
      return s;
    }
    if (q[2] % s.q_heads || k[2] % s.kv_heads || v[2] % s.kv_heads)
      why = "the hidden sizes must be multiples of the head counts";
    s.q_seq = q[1];
    s.kv_seq = k[1];
    s.head_size = q[2] / s.q_heads;
    s.v_head_size = v[2] / s.kv_heads;
    if (k[2] / s.kv_heads != s.head_size) why = "Q's and K's head sizes differ";
    if (v[1] != s.kv_seq) why = "K and V have different sequence lengths";
  } else {
    s.q_heads = q[1];
    s.kv_heads = k[1];
    s.q_seq = q[2];
    s.kv_seq = k[2];
    s.head_size = q[3];
    s.v_head_size = v[3];
    if (k[3] != s.head_size) why = "Q's and K's head sizes differ";
    if (v[1] != s.kv_heads || v[2] != s.kv_seq) why = "K and V have different head counts or sequence lengths";
  }
  if (s.kv_heads <= 0 || s.q_heads % s.kv_heads) why = "q_num_heads must be a multiple of kv_num_heads";
  if (!past_key.empty()) {
    if (past_key.size() != 4 || past_key[0] != s.batch || past_key[1] != s.kv_heads || past_key[3] != s.head_size)
      why = "past_key must be [batch, kv_num_heads, past_sequence_length, head_size]";
    else
      s.past_seq = past_key[2];
  }
  return s;
}

// The factor applied to both Q and K (the square root of the logits' scale), in float32 as the
// reference rounds it.
inline float attention_qk_factor(const Node& node, int64_t head_size) {
  const double scale = node.attrs.has("scale") ? node.attrs.get_float("scale", 0.f) : 1.0 / std::sqrt(double(head_size));
  return static_cast<float>(std::sqrt(scale));
}

// How far key j may run ahead of query i under causal and window masking: the offset of query
// i's position (past length, nonpad_kv_seqlen[b] - q_seq, or 0).
inline int64_t attention_query_offset(const AttentionShape& s, const int64_t* nonpad_kv_seqlen, int64_t b) {
  if (s.past_seq > 0 || !nonpad_kv_seqlen) return s.past_seq;
  return nonpad_kv_seqlen[b] - s.q_seq;
}

// Whether causal, window and padding masking let query i of batch b see key j.
inline bool attention_key_allowed(const Node& node, const AttentionShape& s, const int64_t* nonpad_kv_seqlen, int64_t b,
                                  int64_t i, int64_t j) {
  const int64_t offset = attention_query_offset(s, nonpad_kv_seqlen, b);
  if (node.attrs.get_int("is_causal", 0) && j > i + offset) return false;
  const int64_t left = node.attrs.get_int("left_window_size", -1), right = node.attrs.get_int("right_window_size", -1);
  const int64_t diff = i + offset - j;
  if (left >= 0 && diff > left) return false;
  if (right >= 0 && -diff > right) return false;
  if (nonpad_kv_seqlen && j >= nonpad_kv_seqlen[b]) return false;
  return true;
}

}  // namespace kiln::ir
