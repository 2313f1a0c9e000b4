// Schemas of ONNX's Attention (opset 23 on) and kiln::StridedAttention (attention_params.h has
// the semantics of both).
#include "ops/attention_params.h"
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

Dim add_dims(const Dim& a, const Dim& b) { return a.known() && b.known() ? Dim(a.value + b.value) : Dim::unknown(); }
Dim div_dim(const Dim& a, int64_t b) { return a.known() && b > 0 ? Dim(a.value / b) : Dim::unknown(); }
Dim mul_dim(int64_t a, const Dim& b) { return b.known() ? Dim(a * b.value) : Dim::unknown(); }

void infer_attention(InferContext& ctx) {
  const DType dtype = ctx.dtype(0);
  if (!is_float(dtype)) ctx.unsupported("Q must be a floating-point tensor, not " + to_string(dtype));
  if (ctx.dtype(1) != dtype || ctx.dtype(2) != dtype) ctx.fail("Q, K and V must have the same type");
  const bool past = ctx.has_input(4) || ctx.has_input(5);
  if (past && !(ctx.has_input(4) && ctx.has_input(5))) ctx.fail("past_key and past_value go together");
  if (past && ctx.has_input(6)) ctx.fail("nonpad_kv_seqlen cannot be combined with a past key/value cache");
  if (ctx.has_input(3) && ctx.dtype(3) != DType::kBool && ctx.dtype(3) != dtype)
    ctx.fail("attn_mask must be bool or Q's type, not " + to_string(ctx.dtype(3)));
  if (ctx.has_input(6) && ctx.dtype(6) != DType::kInt64) ctx.fail("nonpad_kv_seqlen must be int64");
  const int64_t mode = ctx.node.attrs.get_int("qk_matmul_output_mode", 0);
  if (mode < 0 || mode > 3) ctx.fail("qk_matmul_output_mode must be 0, 1, 2 or 3, not " + std::to_string(mode));
  if (!ctx.shape_known(0) || !ctx.shape_known(1) || !ctx.shape_known(2)) {
    for (size_t o = 0; o < 4; ++o) ctx.set_output(o, dtype, std::nullopt);
    return;
  }
  const Dims &q = ctx.shape(0), &k = ctx.shape(1), &v = ctx.shape(2);
  if (q.size() != k.size() || q.size() != v.size() || (q.size() != 3 && q.size() != 4))
    ctx.fail("Q, K and V must all be 3-D or all 4-D");
  const bool three_d = q.size() == 3;
  // With every dimension known, check them as the kernels will see them.
  if (all_known(q) && all_known(k) && all_known(v) && (!past || (ctx.shape_known(4) && all_known(ctx.shape(4))))) {
    std::string why;
    attention_shape(ctx.node, known_values(q), known_values(k), known_values(v),
                    past ? known_values(ctx.shape(4)) : std::vector<int64_t>{}, why);
    if (!why.empty()) ctx.fail(why);
  }
  const int64_t q_heads_attr = ctx.node.attrs.get_int("q_num_heads", 0), kv_heads = ctx.node.attrs.get_int("kv_num_heads", 0);
  if (three_d && (q_heads_attr <= 0 || kv_heads <= 0)) ctx.fail("3-D inputs need q_num_heads and kv_num_heads");
  const Dim batch = q[0], q_seq = three_d ? q[1] : q[2], q_heads = three_d ? Dim(q_heads_attr) : q[1];
  const Dim kv_head_count = three_d ? Dim(kv_heads) : k[1];
  const Dim new_kv = three_d ? k[1] : k[2];
  Dim past_seq = Dim(0);
  if (past) past_seq = ctx.shape_known(4) && ctx.shape(4).size() == 4 ? ctx.shape(4)[2] : Dim::unknown();
  const Dim total_kv = past ? add_dims(past_seq, new_kv) : new_kv;
  const Dim head_size = three_d ? div_dim(k[2], kv_heads) : k[3];
  const Dim v_head_size = three_d ? div_dim(v[2], kv_heads) : v[3];
  Dims y = three_d ? Dims{batch, q_seq, q_heads_attr > 0 ? mul_dim(q_heads_attr, v_head_size) : Dim::unknown()}
                   : Dims{batch, q_heads, q_seq, v_head_size};
  ctx.set_output(0, dtype, y);
  ctx.set_output(1, dtype, Dims{batch, kv_head_count, total_kv, head_size});
  ctx.set_output(2, dtype, Dims{batch, kv_head_count, total_kv, v_head_size});
  ctx.set_output(3, dtype, Dims{batch, q_heads, q_seq, total_kv});
}

// Q.K^T and P.V: 2 * keys * (elements of Q + elements of Y) multiply-adds' FLOPs, keys being the
// past ones and the new ones.
int64_t attention_flops(const FlopsContext& ctx) {
  const TensorType* k = ctx.input_types.size() > 1 ? ctx.input_types[1] : nullptr;
  if (!k || !k->shape || k->shape->size() < 3) return 0;
  const Dim& new_keys = (*k->shape)[k->shape->size() == 3 ? 1 : 2];
  int64_t keys = new_keys.known() ? new_keys.value : 0;
  if (ctx.input_types.size() > 4 && ctx.input_types[4] && ctx.input_types[4]->shape &&
      ctx.input_types[4]->shape->size() == 4) {
    const Dim& past = (*ctx.input_types[4]->shape)[2];
    keys = past.known() && keys ? keys + past.value : 0;
  }
  return 2 * keys * (FlopsContext::numel(ctx.input_types[0]) + FlopsContext::numel(ctx.output_types[0]));
}

void infer_strided_attention(InferContext& ctx) {
  const DType dtype = ctx.dtype(0);
  if (!is_float(dtype)) ctx.unsupported("Q must be a floating-point tensor, not " + to_string(dtype));
  if (ctx.dtype(1) != dtype || ctx.dtype(2) != dtype) ctx.fail("Q, K and V must have the same type");
  if (ctx.has_input(3) && ctx.dtype(3) != DType::kBool && ctx.dtype(3) != dtype)
    ctx.fail("attn_mask must be bool or Q's type, not " + to_string(ctx.dtype(3)));
  // The views are checked against the sources' sizes; without those, against no bound at all.
  int64_t elements[3];
  for (size_t i = 0; i < 3; ++i) {
    const int64_t n = ctx.shape_known(i) && all_known(ctx.shape(i)) ? FlopsContext::numel(&ctx.type(i)) : -1;
    elements[i] = n < 0 ? std::numeric_limits<int64_t>::max() : n;
  }
  std::string why;
  const StridedAttentionGeometry g = strided_attention_geometry(ctx.node, elements[0], elements[1], elements[2], why);
  if (!why.empty()) ctx.fail(why);
  // Inputs 4 and 5, y_scale and y_zero_point (passes/fuse_attention_quantize.cc): Y written as
  // int8, round(Y / y_scale) + y_zero_point saturated, as QuantizeLinear per tensor.
  DType y_type = dtype;
  if (ctx.has_input(4) || ctx.has_input(5)) {
    if (!ctx.has_input(4) || !ctx.has_input(5)) ctx.fail("y_scale and y_zero_point come together");
    if (ctx.dtype(4) != DType::kFloat32) ctx.fail("y_scale must be float32, is " + to_string(ctx.dtype(4)));
    if (ctx.dtype(5) != DType::kInt8) ctx.fail("y_zero_point must be int8, is " + to_string(ctx.dtype(5)));
    for (size_t i : {size_t{4}, size_t{5}})
      if (!ctx.shape_known(i) ||
          !(ctx.shape(i).empty() || (ctx.shape(i).size() == 1 && ctx.shape(i)[0].known() && ctx.shape(i)[0].value == 1)))
        ctx.fail(std::string(i == 4 ? "y_scale" : "y_zero_point") + " must hold one value (per tensor)");
    y_type = DType::kInt8;
  }
  ctx.set_output(0, y_type, dims_of(g.z_shape));
}

int64_t strided_attention_flops(const FlopsContext& ctx) {
  const std::vector<int64_t> q = ctx.node.attrs.get_ints("q_shape", {}), k = ctx.node.attrs.get_ints("k_shape", {}),
                             v = ctx.node.attrs.get_ints("v_shape", {});
  if (q.size() != 4 || k.size() != 4 || v.size() != 4) return 0;
  for (const std::vector<int64_t>* s : {&q, &k, &v})
    for (int64_t d : *s)
      if (d < 0 || d > (int64_t{1} << 40)) return 0;  // the schema rejects these
  const __int128 rows = static_cast<__int128>(q[0]) * q[1] * q[2];
  const __int128 flops = 2 * static_cast<__int128>(k[2]) * rows * (q[3] + v[3]);
  return flops > std::numeric_limits<int64_t>::max() ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(flops);
}

}  // namespace

KILN_REGISTER_OPS(attention) {
  registry.add({"Attention", "", 3, 7, 1, 4, infer_attention, attention_flops,
                "float inputs; softmax_precision is taken as float32 (the CPU engine computes in float32)"});
  OpSchema s;
  s.op = "StridedAttention";
  s.domain = "kiln";
  s.min_inputs = 3;
  s.max_inputs = 6;
  s.infer = infer_strided_attention;
  s.flops = strided_attention_flops;
  registry.add(std::move(s));
}

}  // namespace kiln::ir
