// Schema of GridSample (grid_sample_params.h has the arithmetic): X [N, C, D1..Dr] sampled at
// grid [N, H1..Hr, r] gives Y [N, C, H1..Hr].
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_grid_sample(InferContext& ctx) {
  const DType dtype = ctx.dtype(0);
  if (!is_float(ctx.dtype(1))) ctx.fail("grid must be a floating-point tensor");
  const std::string mode = ctx.node.attrs.get_string("mode", "linear");
  if (mode != "linear" && mode != "nearest" && mode != "cubic") ctx.fail("unknown mode '" + mode + "'");
  const std::string padding = ctx.node.attrs.get_string("padding_mode", "zeros");
  if (padding != "zeros" && padding != "border" && padding != "reflection")
    ctx.fail("unknown padding_mode '" + padding + "'");
  if (!ctx.shape_known(0) || !ctx.shape_known(1)) {
    ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  const Dims &x = ctx.shape(0), &grid = ctx.shape(1);
  if (x.size() < 3) ctx.fail("X must be [N, C, spatial...]");
  if (grid.size() != x.size()) ctx.fail("grid must have rank " + std::to_string(x.size()) + ", X's rank");
  if (grid.back().known() && grid.back().value != static_cast<int64_t>(x.size()) - 2)
    ctx.fail("grid's last dimension must be " + std::to_string(x.size() - 2) + ", the number of spatial dimensions");
  if (x[0].known() && grid[0].known() && x[0].value != grid[0].value) ctx.fail("X and grid must have the same batch");
  Dims y = {x[0], x[1]};
  y.insert(y.end(), grid.begin() + 1, grid.end() - 1);
  ctx.set_output(0, dtype, y);
}

}  // namespace

KILN_REGISTER_OPS(grid_sample) {
  registry.add({"GridSample", "", 2, 2, 1, 1, infer_grid_sample, nullptr, "float32 on the CPU engine"});
}

}  // namespace kiln::ir
