// Schema of Pad (pads, constant_value and axes as inputs, as since opset 18).
#include "ir/sizes.h"
#include "ops/shape_dims.h"

namespace kiln::ir {

// Pads per input axis as [begins..., ends...] of the full rank, from the pads and axes inputs.
std::vector<int64_t> full_pads(const Node& node, int64_t rank, const std::vector<int64_t>& pads,
                               const std::optional<std::vector<int64_t>>& axes) {
  auto fail = [&node](const std::string& m) { throw node.error(ErrorKind::kInvalidModel, m); };
  std::vector<int64_t> ax;
  if (axes) ax = *axes;
  else
    for (int64_t i = 0; i < rank; ++i) ax.push_back(i);
  if (pads.size() != 2 * ax.size())
    fail("pads has " + std::to_string(pads.size()) + " values, expected " + std::to_string(2 * ax.size()));
  std::vector<int64_t> full(static_cast<size_t>(2 * rank), 0);
  for (size_t k = 0; k < ax.size(); ++k) {
    int64_t a = ax[k] < 0 ? ax[k] + rank : ax[k];
    if (a < 0 || a >= rank) fail("axis " + std::to_string(ax[k]) + " is out of range for rank " + std::to_string(rank));
    full[static_cast<size_t>(a)] = pads[k];
    full[static_cast<size_t>(a + rank)] = pads[k + ax.size()];
  }
  return full;
}

namespace {

void infer_pad(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  std::string mode = ctx.node.attrs.get_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    ctx.fail("unknown mode '" + mode + "'");
  if (ctx.has_input(2) && ctx.dtype(2) != dtype) ctx.fail("constant_value must have the data's type");
  if (!ctx.shape_known(0)) {
    ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  const Dims& in = ctx.shape(0);
  int64_t rank = static_cast<int64_t>(in.size());
  std::optional<std::vector<int64_t>> pads = known_ints(ctx, 1);
  std::optional<std::vector<int64_t>> axes;
  if (ctx.has_input(3)) axes = known_ints(ctx, 3);
  if (!pads || (ctx.has_input(3) && !axes)) {
    ctx.set_output(0, dtype, Dims(in.size(), Dim::unknown()));
    return;
  }
  std::vector<int64_t> full = full_pads(ctx.node, rank, *pads, axes);
  Dims out;
  for (int64_t i = 0; i < rank; ++i) {
    int64_t b = full[static_cast<size_t>(i)], e = full[static_cast<size_t>(i + rank)];
    const Dim& d = in[static_cast<size_t>(i)];
    if (b == 0 && e == 0) {
      out.push_back(d);
      continue;
    }
    if (!d.known()) {
      out.push_back(Dim::unknown());
      continue;
    }
    int64_t size = 0;
    try {
      size = checked_add(checked_add(d.value, b, "the padded axis"), e, "the padded axis");
    } catch (const Error& error) {
      ctx.fail("axis " + std::to_string(i) + ": " + error.message());
    }
    if (size < 0) ctx.fail("pads remove more than axis " + std::to_string(i) + " holds");
    if (mode == "reflect" && (b > d.value - 1 || e > d.value - 1) && (b > 0 || e > 0))
      ctx.fail("reflect pads of " + std::to_string(std::max(b, e)) + " need an axis of size > that; axis " + std::to_string(i) +
               " has size " + std::to_string(d.value));
    if ((mode == "edge" || mode == "wrap") && d.value == 0)
      ctx.fail(mode + " padding of an empty axis");
    out.push_back(Dim(size));
  }
  ctx.set_output(0, dtype, out);
}

}  // namespace

KILN_REGISTER_OPS(pad) {
  registry.add({"Pad", "", 2, 4, 1, 1, infer_pad, nullptr, ""});
}

}  // namespace kiln::ir
