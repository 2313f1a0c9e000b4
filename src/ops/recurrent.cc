// Schemas of the recurrent layers RNN, GRU and LSTM: X [seq, batch, input] (layout 1: [batch,
// seq, input]), W [dirs, gates * hidden, input], R [dirs, gates * hidden, hidden] with 1, 3 and 4
// gates; outputs Y [seq, dirs, batch, hidden] (layout 1: [batch, seq, dirs, hidden]), Y_h (and
// LSTM's Y_c) [dirs, batch, hidden] (layout 1: [batch, dirs, hidden]).
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

int64_t gates_of(const std::string& op) { return op == "LSTM" ? 4 : op == "GRU" ? 3 : 1; }

void infer_recurrent(InferContext& ctx) {
  const DType dtype = ctx.dtype(0);
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64 && dtype != DType::kFloat16)
    ctx.fail("X must be floating point");
  const std::string direction = ctx.node.attrs.get_string("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    ctx.fail("direction must be forward, reverse or bidirectional, not '" + direction + "'");
  const int64_t dirs = direction == "bidirectional" ? 2 : 1;
  const int64_t layout = ctx.node.attrs.get_int("layout", 0);
  if (layout != 0 && layout != 1) ctx.fail("layout must be 0 or 1");
  if (ctx.has_input(4) && ctx.dtype(4) != DType::kInt32) ctx.fail("sequence_lens must be int32");
  Dim hidden = Dim::unknown();
  if (ctx.node.attrs.has("hidden_size")) {
    const int64_t h = ctx.node.attrs.get_int("hidden_size", 0);
    if (h <= 0) ctx.fail("hidden_size must be positive");
    hidden = Dim(h);
  }
  if (ctx.shape_known(1)) {
    const Dims& w = ctx.shape(1);
    if (w.size() != 3) ctx.fail("W must have rank 3");
    if (w[0].known() && w[0].value != dirs) ctx.fail("W's first dim must be the number of directions");
    const int64_t gates = gates_of(ctx.node.op);
    if (w[1].known()) {
      if (w[1].value % gates != 0) ctx.fail("W's second dim must be " + std::to_string(gates) + " x hidden_size");
      if (!hidden.known()) hidden = Dim(w[1].value / gates);
      else if (w[1].value != gates * hidden.value) ctx.fail("W's second dim must be " + std::to_string(gates) + " x hidden_size");
    }
  }
  Dim seq = Dim::unknown(), batch = Dim::unknown();
  if (ctx.shape_known(0)) {
    const Dims& x = ctx.shape(0);
    if (x.size() != 3) ctx.fail("X must have rank 3");
    seq = x[layout == 0 ? 0 : 1];
    batch = x[layout == 0 ? 1 : 0];
  }
  const Dims y = layout == 0 ? Dims{seq, Dim(dirs), batch, hidden} : Dims{batch, seq, Dim(dirs), hidden};
  const Dims state = layout == 0 ? Dims{Dim(dirs), batch, hidden} : Dims{batch, Dim(dirs), hidden};
  ctx.set_output(0, dtype, y);
  for (size_t o = 1; o < ctx.node.outputs.size(); ++o) ctx.set_output(o, dtype, state);
}

}  // namespace

KILN_REGISTER_OPS(recurrent) {
  registry.add({"RNN", "", 3, 6, 1, 2, infer_recurrent, nullptr, ""});
  registry.add({"GRU", "", 3, 6, 1, 2, infer_recurrent, nullptr, ""});
  registry.add({"LSTM", "", 3, 8, 1, 3, infer_recurrent, nullptr, ""});
}

}  // namespace kiln::ir
