// Schema of Split: sizes from the `split` input, else equal parts (opset 18's num_outputs
// allows a smaller last part).
#include "ir/sizes.h"
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_split(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  size_t n_out = ctx.output_types.size();
  if (!ctx.shape_known(0)) {
    for (size_t o = 0; o < n_out; ++o) ctx.set_output(o, dtype, std::nullopt);
    return;
  }
  const Dims& in = ctx.shape(0);
  int64_t axis = static_cast<int64_t>(dim_axis(ctx, ctx.node.attrs.get_int("axis", 0), static_cast<int64_t>(in.size())));
  const Dim& d = in[static_cast<size_t>(axis)];
  std::vector<Dim> sizes(n_out, Dim::unknown());
  if (ctx.has_input(1)) {
    std::optional<std::vector<int64_t>> split = known_ints(ctx, 1);
    if (split) {
      if (split->size() != n_out)
        ctx.fail("split has " + std::to_string(split->size()) + " sizes for " + std::to_string(n_out) + " outputs");
      int64_t sum = 0;
      for (size_t o = 0; o < n_out; ++o) {
        if ((*split)[o] < 0) ctx.fail("split sizes must be >= 0");
        sizes[o] = Dim((*split)[o]);
        try {
          sum = checked_add(sum, (*split)[o], "the sum of the split sizes");
        } catch (const Error& error) {
          ctx.fail(error.message());
        }
      }
      if (d.known() && sum != d.value)
        ctx.fail("split sizes add up to " + std::to_string(sum) + " but axis " + std::to_string(axis) + " has size " +
                 std::to_string(d.value));
    }
  } else {
    if (ctx.node.attrs.has("num_outputs") && ctx.node.attrs.get_int("num_outputs", 0) != static_cast<int64_t>(n_out))
      ctx.fail("num_outputs is " + std::to_string(ctx.node.attrs.get_int("num_outputs", 0)) + " but the node has " +
               std::to_string(n_out) + " outputs");
    if (d.known()) {
      int64_t k = static_cast<int64_t>(n_out);
      if (d.value % k == 0) {
        for (auto& s : sizes) s = Dim(d.value / k);
      } else if (ctx.node.attrs.has("num_outputs")) {
        int64_t part = (d.value + k - 1) / k;
        if (part * (k - 1) >= d.value && d.value > 0)
          ctx.fail("cannot split size " + std::to_string(d.value) + " into " + std::to_string(k) + " parts");
        for (size_t o = 0; o < n_out; ++o) sizes[o] = Dim(o + 1 < n_out ? part : d.value - part * (k - 1));
      } else {
        ctx.fail("axis " + std::to_string(axis) + " has size " + std::to_string(d.value) + ", which does not split evenly into " +
                 std::to_string(n_out) + " outputs");
      }
    }
  }
  std::optional<Dims> sv = in.size() == 1 ? ctx.int_elements(0) : std::nullopt;
  int64_t offset = 0;
  for (size_t o = 0; o < n_out; ++o) {
    Dims out = in;
    out[static_cast<size_t>(axis)] = sizes[o];
    ctx.set_output(o, dtype, out);
    if (sv && sizes[o].known() && offset >= 0 && sizes[o].value <= static_cast<int64_t>(sv->size()) - offset) {
      ctx.set_symbolic(o, Dims(sv->begin() + offset, sv->begin() + offset + sizes[o].value));
      offset += sizes[o].value;
    } else {
      offset = -1;
    }
  }
}

}  // namespace

KILN_REGISTER_OPS(split) {
  registry.add({"Split", "", 1, 2, 1, 1 << 20, infer_split, nullptr, ""});
}

}  // namespace kiln::ir
