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

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
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

// Causal, window and padding masking: the keys [first, last) query i of batch b may see.
struct AttentionKeyRange {
  int64_t first = 0, last = 0;
};

struct AttentionMasking {
  bool causal = false;
  int64_t left = -1, right = -1;  // window sizes; -1: unbounded

  explicit AttentionMasking(const Node& node)
      : causal(node.attrs.get_int("is_causal", 0) != 0),
        left(node.attrs.get_int("left_window_size", -1)),
        right(node.attrs.get_int("right_window_size", -1)) {}

  AttentionKeyRange keys(const AttentionShape& s, const int64_t* nonpad_kv_seqlen, int64_t b, int64_t i) const {
    const int64_t at = i + attention_query_offset(s, nonpad_kv_seqlen, b);  // the query's position among keys
    int64_t first = 0, last = s.total_kv();
    // (Compared as differences: a window size from a file may be near INT64_MAX.)
    if (causal && at < last) last = std::max<int64_t>(at + 1, 0);
    if (left >= 0 && at - first > left) first = at - left;
    if (right >= 0 && last - at - 1 > right) last = at + right + 1;
    if (nonpad_kv_seqlen) last = std::min(last, nonpad_kv_seqlen[b]);
    return {first, std::max(first, last)};
  }
};

// kiln::StridedAttention(Q source, K source, V source, attn_mask?, y_scale?, y_zero_point?) -> Z:
// Attention's 4-D form on Q, K and V read as strided views of their sources, Y written through a
// strided view of Z (passes/fold_attention_views.cc makes it from an Attention and the Reshapes,
// Transposes, Gathers, Slices and Splits around it, so that no layer copies the heads into
// place). With y_scale and y_zero_point (float32 and int8, one value each; made by
// passes/fuse_attention_quantize.cc) Z is int8: QuantizeLinear's round(Y / y_scale) + y_zero_point,
// saturated, of the float32 Y.
//   Attributes: Attention's scale, is_causal, left_window_size, right_window_size, softcap;
//     q_shape [B, Hq, S, D], k_shape [B, Hkv, T, D], v_shape [B, Hkv, T, Dv];
//     q_view, k_view, v_view: [offset, batch stride, head stride, row stride] in elements of the
//       source (elements along the head size are adjacent);
//     y_shape: Z's shape, exactly B * Hq * S * Dv elements; y_view: where Y [b, h, s, d] lies
//       in Z, each element of Z written once;
//     same_values_as (optional): names of the values Z replaced (Y and the layout layers after
//       it), whose elements Z holds; nothing computes with it (quantize_graph finds their scales).
struct HeadLayout {
  int64_t offset = 0, batch = 0, head = 0, row = 0;
  int64_t at(int64_t b, int64_t h, int64_t s) const { return offset + b * batch + h * head + s * row; }
};

// An axis of size 1 is never stepped along, so its stride is free: it gets the one a layout
// packed right above the next inner axis would have (a row stride of at least the head size,
// no zero strides), as cuBLASLt's leading dimensions and cuDNN's strides want.
inline void settle_unit_axes(HeadLayout& l, int64_t batch, int64_t heads, int64_t seq, int64_t size) {
  if (seq == 1) l.row = size;
  if (heads == 1) l.head = l.row * seq;
  if (batch == 1) l.batch = l.head * heads;
}

struct StridedAttentionGeometry {
  AttentionShape shape;
  HeadLayout q, k, v, y;
  std::vector<int64_t> z_shape;
};

namespace strided_attention_detail {

inline bool read_four(const Node& node, const char* name, int64_t out[4], std::string& why) {
  const std::vector<int64_t> v = node.attrs.get_ints(name, {});
  if (v.size() != 4) {
    why = std::string(name) + " must hold 4 integers";
    return false;
  }
  std::copy(v.begin(), v.end(), out);
  return true;
}

// Whether the view [sizes] with `strides` (head size adjacent) starting at `offset` stays inside
// `elements`; the largest index is computed in 128 bits, so hostile values cannot wrap.
inline bool inside(const HeadLayout& l, const int64_t sizes[4], int64_t elements) {
  if (l.offset < 0 || l.batch < 0 || l.head < 0 || l.row < 0) return false;
  __int128 last = l.offset;
  const int64_t strides[4] = {l.batch, l.head, l.row, 1};
  for (int i = 0; i < 4; ++i) last += static_cast<__int128>(sizes[i] - 1) * strides[i];
  return last < elements;
}

}  // namespace strided_attention_detail

// The geometry of a StridedAttention node whose sources hold the given numbers of elements;
// `why` is set (and the result meaningless) when the attributes contradict each other or a view
// leaves its tensor or writes an element of Z twice.
inline StridedAttentionGeometry strided_attention_geometry(const Node& node, int64_t q_elements, int64_t k_elements,
                                                           int64_t v_elements, std::string& why) {
  namespace d = strided_attention_detail;
  StridedAttentionGeometry g;
  why.clear();
  int64_t qs[4], ks[4], vs[4], views[4][4];
  if (!d::read_four(node, "q_shape", qs, why) || !d::read_four(node, "k_shape", ks, why) ||
      !d::read_four(node, "v_shape", vs, why))
    return g;
  const char* view_names[4] = {"q_view", "k_view", "v_view", "y_view"};
  for (int i = 0; i < 4; ++i)
    if (!d::read_four(node, view_names[i], views[i], why)) return g;
  for (const int64_t* s : {qs, ks, vs})
    for (int i = 0; i < 4; ++i)
      if (s[i] < 1 || s[i] > (int64_t{1} << 40)) {
        why = "q_shape, k_shape and v_shape must hold sizes from 1 to 2^40";
        return g;
      }
  g.shape = attention_shape(node, {qs[0], qs[1], qs[2], qs[3]}, {ks[0], ks[1], ks[2], ks[3]}, {vs[0], vs[1], vs[2], vs[3]},
                            {}, why);
  if (!why.empty()) return g;
  HeadLayout* layouts[4] = {&g.q, &g.k, &g.v, &g.y};
  for (int i = 0; i < 4; ++i) *layouts[i] = {views[i][0], views[i][1], views[i][2], views[i][3]};
  const int64_t ys[4] = {qs[0], qs[1], qs[2], vs[3]};
  const std::pair<const int64_t*, int64_t> reads[3] = {{qs, q_elements}, {ks, k_elements}, {vs, v_elements}};
  for (int i = 0; i < 3; ++i)
    if (!d::inside(*layouts[i], reads[i].first, reads[i].second)) {
      why = std::string(view_names[i]) + " reaches outside its source";
      return g;
    }
  g.z_shape = node.attrs.get_ints("y_shape", {});
  __int128 z_elements = 1, y_elements = 1;
  for (int64_t dim : g.z_shape) {
    if (dim < 0) {
      why = "y_shape has a negative size";
      return g;
    }
    z_elements *= dim;
    if (z_elements > (__int128{1} << 62)) break;
  }
  for (int64_t dim : ys) y_elements *= dim;
  if (g.z_shape.empty() || z_elements != y_elements) {
    why = "y_shape must hold exactly the " + std::to_string(static_cast<int64_t>(y_elements)) + " elements of Y";
    return g;
  }
  // Each element of Z written once: ordered by stride, every axis steps over the whole extent
  // of the axes below it, and the last element lies inside Z.
  std::vector<std::pair<int64_t, int64_t>> axes = {{1, ys[3]}};  // (stride, size)
  const int64_t y_strides[3] = {g.y.batch, g.y.head, g.y.row};
  for (int i = 0; i < 3; ++i)
    if (ys[i] > 1) axes.push_back({y_strides[i], ys[i]});
  std::sort(axes.begin(), axes.end());
  __int128 extent = 0;
  for (const auto& [stride, size] : axes) {
    if (stride < extent || stride < 1) {
      why = "y_view writes some element of Z twice";
      return g;
    }
    extent = static_cast<__int128>(stride) * size;
  }
  if (!d::inside(g.y, ys, static_cast<int64_t>(z_elements))) why = "y_view reaches outside Z";
  return g;
}

}  // namespace kiln::ir
