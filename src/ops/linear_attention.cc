// Schema of LinearAttention (opset 27): output [B, T, Hq * dv] and present_state
// [B, Hkv, dk, dv] (ops/linear_attention.h).
#include "ops/linear_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "ir/op_schema.h"
#include "ir/sizes.h"
#include "ops/known_shapes.h"

namespace kiln::ir {

LinearAttentionRule linear_attention_rule(const Node& node) {
  auto fail = [&](const std::string& why) { throw node.error(ErrorKind::kInvalidModel, why); };
  const std::string rule = node.attrs.get_string("update_rule", "gated_delta");
  LinearAttentionRule r;
  if (rule == "linear") r = {false, false};
  else if (rule == "gated") r = {true, false};
  else if (rule == "delta") r = {false, true};
  else if (rule != "gated_delta") fail("update_rule must be linear, gated, delta or gated_delta, is '" + rule + "'");
  if (!node.attrs.has("q_num_heads") || !node.attrs.has("kv_num_heads")) fail("q_num_heads and kv_num_heads are required");
  const int64_t q = node.attrs.get_int("q_num_heads", 0), kv = node.attrs.get_int("kv_num_heads", 0);
  if (q <= 0 || kv <= 0 || q % kv != 0)
    fail("q_num_heads (" + std::to_string(q) + ") must be a positive multiple of kv_num_heads (" + std::to_string(kv) + ")");
  return r;
}

LinearAttentionParams linear_attention_params(const Node& node, const std::vector<int64_t>& query,
                                              const std::vector<int64_t>& key, const std::vector<int64_t>& value,
                                              const std::optional<std::vector<int64_t>>& past_state,
                                              const std::optional<std::vector<int64_t>>& decay,
                                              const std::optional<std::vector<int64_t>>& beta) {
  auto fail = [&](const std::string& why) { throw node.error(ErrorKind::kInvalidModel, why); };
  LinearAttentionParams p;
  p.rule = linear_attention_rule(node);
  p.q_heads = node.attrs.get_int("q_num_heads", 0);
  p.kv_heads = node.attrs.get_int("kv_num_heads", 0);
  for (const auto* s : {&query, &key, &value})
    if (s->size() != 3) fail("query, key and value must be [batch, length, heads * dim], one has shape " + shape_string(*s));
  p.batch = query[0], p.length = query[1];
  if (query[2] % p.q_heads != 0)
    fail("query's last dim " + std::to_string(query[2]) + " does not divide into " + std::to_string(p.q_heads) + " heads");
  p.key_dim = query[2] / p.q_heads;
  if (value[2] % p.kv_heads != 0)
    fail("value's last dim " + std::to_string(value[2]) + " does not divide into " + std::to_string(p.kv_heads) + " heads");
  p.value_dim = value[2] / p.kv_heads;
  const std::vector<int64_t> want_key = {p.batch, p.length, p.kv_heads * p.key_dim};
  if (key != want_key) fail("key has shape " + shape_string(key) + "; query and the head counts need " + shape_string(want_key));
  if (value[0] != p.batch || value[1] != p.length)
    fail("value has shape " + shape_string(value) + ", query " + shape_string(query) + ": batch and length differ");
  const std::vector<int64_t> state = {p.batch, p.kv_heads, p.key_dim, p.value_dim};
  if (past_state && *past_state != state) fail("past_state has shape " + shape_string(*past_state) + "; it must be " + shape_string(state));
  if (p.rule.gated != decay.has_value())
    fail(p.rule.gated ? "this update_rule gates the state: it needs decay" : "this update_rule has no gate: decay must be absent");
  if (p.rule.delta != beta.has_value())
    fail(p.rule.delta ? "this update_rule corrects by delta: it needs beta" : "this update_rule has no delta step: beta must be absent");
  if (decay) {
    p.decay_per_key_dim = decay->size() == 3 && (*decay)[2] == p.kv_heads * p.key_dim && p.key_dim != 1;
    const std::vector<int64_t> per_head = {p.batch, p.length, p.kv_heads};
    if (*decay != per_head && !p.decay_per_key_dim)
      fail("decay has shape " + shape_string(*decay) + "; it must be " + shape_string(per_head) + " or [" +
           std::to_string(p.batch) + ", " + std::to_string(p.length) + ", " + std::to_string(p.kv_heads * p.key_dim) + "]");
  }
  if (beta) {
    p.beta_per_head = beta->size() == 3 && (*beta)[2] == p.kv_heads && p.kv_heads != 1;
    if (beta->size() != 3 || (*beta)[0] != p.batch || (*beta)[1] != p.length || ((*beta)[2] != 1 && !p.beta_per_head))
      fail("beta has shape " + shape_string(*beta) + "; it must be [" + std::to_string(p.batch) + ", " +
           std::to_string(p.length) + ", " + std::to_string(p.kv_heads) + "] or [..., 1]");
  }
  const float scale = node.attrs.get_float("scale", 0.f);
  p.scale = scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(p.key_dim));
  return p;
}

namespace {


void infer_linear_attention(InferContext& ctx) {
  const DType dt = ctx.dtype(0);
  if (!is_float(dt)) ctx.fail("query type " + to_string(dt) + " is not a float type");
  for (size_t i : {size_t{1}, size_t{2}, size_t{4}, size_t{5}})
    if (ctx.has_input(i) && ctx.dtype(i) != dt)
      ctx.fail("input " + std::to_string(i) + " is " + to_string(ctx.dtype(i)) + ", query is " + to_string(dt));
  const DType state_type = ctx.has_input(3) ? ctx.dtype(3) : dt;
  linear_attention_rule(ctx.node);
  const auto q = known_shape(ctx, 0), k = known_shape(ctx, 1), v = known_shape(ctx, 2);
  bool optional_known = true;
  for (size_t i = 3; i < 6; ++i) optional_known = optional_known && (!ctx.has_input(i) || known_shape(ctx, i));
  if (!q || !k || !v || !optional_known) {
    // Batch and length follow the query's dims (symbolic ones too); the rest when known.
    Dims out = unknown_dims(ctx, 3), state = unknown_dims(ctx, 4);
    if (ctx.shape_known(0) && ctx.shape(0).size() == 3) out[0] = state[0] = ctx.shape(0)[0], out[1] = ctx.shape(0)[1];
    state[1] = Dim(ctx.node.attrs.get_int("kv_num_heads", 0));
    ctx.set_output(0, dt, out);
    if (ctx.node.outputs.size() > 1) ctx.set_output(1, state_type, state);
    return;
  }
  auto given = [&](size_t i) { return ctx.has_input(i) ? known_shape(ctx, i) : std::nullopt; };
  const LinearAttentionParams p = linear_attention_params(ctx.node, *q, *k, *v, given(3), given(4), given(5));
  ctx.set_output(0, dt, dims_of({p.batch, p.length, checked_mul(p.q_heads, p.value_dim, "LinearAttention's output width")}));
  if (ctx.node.outputs.size() > 1) ctx.set_output(1, state_type, dims_of({p.batch, p.kv_heads, p.key_dim, p.value_dim}));
}

int64_t linear_attention_flops(const FlopsContext& ctx) {
  // Per step and head: the state update and the read, each about 2 dk dv (the delta step one more).
  const TensorType* q = ctx.input_types[0];
  const int64_t out = FlopsContext::numel(ctx.output_types[0]);
  if (!q || !q->shape || q->shape->size() != 3 || !(*q->shape)[2].known() || !ctx.node.attrs.has("q_num_heads")) return 0;
  const int64_t heads = std::max<int64_t>(1, ctx.node.attrs.get_int("q_num_heads", 1));
  const __int128 flops = 6 * static_cast<__int128>(out) * ((*q->shape)[2].value / heads);
  return flops > std::numeric_limits<int64_t>::max() ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(flops);
}

}  // namespace

KILN_REGISTER_OPS(linear_attention) {
  OpSchema s;
  s.op = "LinearAttention";
  s.min_inputs = 3;
  s.max_inputs = 6;
  s.min_outputs = 1;
  s.max_outputs = 2;
  s.infer = infer_linear_attention;
  s.flops = linear_attention_flops;
  registry.add(std::move(s));
}

}  // namespace kiln::ir
