// LinearAttention (opset 27): attention whose memory is a state matrix per key/value head
// instead of the whole past, as linear-attention and Gated DeltaNet layers (Qwen3-Next) keep it.
// query [B, T, Hq * dk], key [B, T, Hkv * dk], value [B, T, Hkv * dv]; optional past_state
// [B, Hkv, dk, dv] (zeros when absent), decay [B, T, Hkv] or [B, T, Hkv * dk] (log-space gates),
// beta [B, T, Hkv] or [B, T, 1]. Step by step t, per key/value head, update_rule says how the
// state S changes before it is read:
//   linear:      S += k v^T
//   gated:       S = exp(g) * S, then S += k v^T
//   delta:       v' = beta (v - S^T k), S += k v'^T
//   gated_delta: S = exp(g) * S, then the delta step (the default rule)
// Output [B, T, Hq * dv]: scale * q^T S, each query head reading the state of key/value head
// h / (Hq / Hkv); present_state is S after the last step. One reading of the node for its schema
// and its CPU kernel.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

struct LinearAttentionRule {
  bool gated = true;  // decay scales the state each step
  bool delta = true;  // the value written is corrected by what the state already recalls
};

// update_rule (default gated_delta) and the head counts: kInvalidModel naming the node for an
// unknown rule, missing or non-positive head counts, or q_num_heads not a multiple of
// kv_num_heads.
LinearAttentionRule linear_attention_rule(const Node& node);

struct LinearAttentionParams {
  LinearAttentionRule rule;
  int64_t batch = 0, length = 0, q_heads = 0, kv_heads = 0, key_dim = 0, value_dim = 0;
  bool decay_per_key_dim = false;  // decay [B, T, Hkv * dk], else one gate per head [B, T, Hkv]
  bool beta_per_head = false;      // beta [B, T, Hkv], else one for every head [B, T, 1]
  float scale = 1.f;               // the attribute, or 1 / sqrt(dk) where it is absent or 0
};

// Checks the shapes of the given inputs against each other and against the rule (gated rules
// need decay and the others refuse it; delta rules need beta and the others refuse it);
// kInvalidModel naming the node and the mismatch otherwise.
LinearAttentionParams linear_attention_params(const Node& node, const std::vector<int64_t>& query,
                                              const std::vector<int64_t>& key, const std::vector<int64_t>& value,
                                              const std::optional<std::vector<int64_t>>& past_state,
                                              const std::optional<std::vector<int64_t>>& decay,
                                              const std::optional<std::vector<int64_t>>& beta);

}  // namespace kiln::ir
