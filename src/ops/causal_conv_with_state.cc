// Schema of CausalConvWithState (opset 27): input [B, C, L] -> output [B, C, L] and
// present_state [B, C, K - 1] (ops/causal_conv_with_state.h).
#include "ops/causal_conv_with_state.h"

#include <limits>
#include <string>

#include "ir/op_schema.h"
#include "ops/known_shapes.h"

namespace kiln::ir {

bool causal_conv_silu(const Node& node) {
  const std::string activation = node.attrs.get_string("activation", "none");
  if (activation == "silu" || activation == "swish") return true;
  if (activation != "none")
    throw node.error(ErrorKind::kInvalidModel, "activation must be none, silu or swish, is '" + activation + "'");
  return false;
}

CausalConvParams causal_conv_params(const Node& node, const std::vector<int64_t>& input,
                                    const std::vector<int64_t>& weight,
                                    const std::optional<std::vector<int64_t>>& bias,
                                    const std::optional<std::vector<int64_t>>& past_state) {
  auto fail = [&](const std::string& why) { throw node.error(ErrorKind::kInvalidModel, why); };
  if (input.size() != 3) fail("input must be [batch, channels, length], has shape " + shape_string(input));
  CausalConvParams p;
  p.batch = input[0], p.channels = input[1], p.length = input[2];
  if (weight.size() != 3 || weight[0] != p.channels || weight[1] != 1 || weight[2] < 1)
    fail("weight must be [channels, 1, k] with k >= 1 for " + std::to_string(p.channels) + " channels, has shape " +
         shape_string(weight));
  p.kernel = weight[2];
  if (bias && *bias != std::vector<int64_t>{p.channels})
    fail("bias has shape " + shape_string(*bias) + "; it must be [" + std::to_string(p.channels) + "]");
  const std::vector<int64_t> state = {p.batch, p.channels, p.kernel - 1};
  if (past_state && *past_state != state)
    fail("past_state has shape " + shape_string(*past_state) + "; this input and weight need " + shape_string(state));
  p.silu = causal_conv_silu(node);
  return p;
}

namespace {


void infer_causal_conv(InferContext& ctx) {
  const DType dt = ctx.dtype(0);
  if (!is_float(dt)) ctx.fail("input type " + to_string(dt) + " is not a float type");
  for (size_t i = 1; i < ctx.num_inputs(); ++i)
    if (ctx.has_input(i) && ctx.dtype(i) != dt)
      ctx.fail("input " + std::to_string(i) + " is " + to_string(ctx.dtype(i)) + ", input 0 is " + to_string(dt));
  causal_conv_silu(ctx.node);
  const auto input = known_shape(ctx, 0), weight = known_shape(ctx, 1);
  const bool optional_known = (!ctx.has_input(2) || known_shape(ctx, 2)) && (!ctx.has_input(3) || known_shape(ctx, 3));
  if (!input || !weight || !optional_known) {
    // The output keeps the input's dims (symbolic ones too); the state's length needs the kernel.
    if (ctx.shape_known(0) && ctx.shape(0).size() != 3)
      ctx.fail("input must be [batch, channels, length], has rank " + std::to_string(ctx.shape(0).size()));
    std::optional<Dims> out = ctx.shape_known(0) ? std::optional<Dims>(ctx.shape(0)) : std::nullopt;
    ctx.set_output(0, dt, out);
    if (ctx.node.outputs.size() > 1) {
      Dims state = unknown_dims(ctx, 3);
      if (out) state[0] = (*out)[0], state[1] = (*out)[1];
      if (weight && weight->size() == 3) state[2] = Dim((*weight)[2] - 1);
      ctx.set_output(1, dt, state);
    }
    return;
  }
  const CausalConvParams p = causal_conv_params(ctx.node, *input, *weight, known_shape(ctx, 2), known_shape(ctx, 3));
  ctx.set_output(0, dt, dims_of({p.batch, p.channels, p.length}));
  if (ctx.node.outputs.size() > 1) ctx.set_output(1, dt, dims_of({p.batch, p.channels, p.kernel - 1}));
}

int64_t causal_conv_flops(const FlopsContext& ctx) {
  const int64_t out = FlopsContext::numel(ctx.output_types[0]);
  const TensorType* w = ctx.input_types[1];
  if (!w || !w->shape || w->shape->size() != 3 || !(*w->shape)[2].known()) return 0;
  const __int128 flops = 2 * static_cast<__int128>(out) * (*w->shape)[2].value;
  return flops > std::numeric_limits<int64_t>::max() ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(flops);
}

}  // namespace

KILN_REGISTER_OPS(causal_conv_with_state) {
  OpSchema s;
  s.op = "CausalConvWithState";
  s.min_inputs = 2;
  s.max_inputs = 4;
  s.min_outputs = 1;
  s.max_outputs = 2;
  s.infer = infer_causal_conv;
  s.flops = causal_conv_flops;
  registry.add(std::move(s));
}

}  // namespace kiln::ir
