// Schema of Col2Im (opset 18): sliding blocks [N, C * prod(block_shape), L] summed back into
// images [N, C, image_shape...], the inverse of im2col. The attributes dilations, pads and
// strides are as Conv's. The output's sizes are known once image_shape is (a constant, or when
// the CPU engine runs); GPU engines need it constant.
#include "ops/col2im.h"

namespace kiln::ir {

Col2ImGeometry col2im_geometry(const Node& node, const std::vector<int64_t>& image, const std::vector<int64_t>& block) {
  auto fail = [&](const std::string& why) { throw Error(ErrorKind::kInvalidModel, why).node(node.name, node.op); };
  const size_t dims = image.size();
  if (dims == 0 || block.size() != dims)
    fail("image_shape and block_shape must have the same, non-zero length (have " + std::to_string(image.size()) + " and " +
         std::to_string(block.size()) + ")");
  Col2ImGeometry g;
  g.image = image;
  g.block = block;
  g.dilations = node.attrs.get_ints("dilations", std::vector<int64_t>(dims, 1));
  g.strides = node.attrs.get_ints("strides", std::vector<int64_t>(dims, 1));
  g.pads = node.attrs.get_ints("pads", std::vector<int64_t>(2 * dims, 0));
  if (g.dilations.size() != dims || g.strides.size() != dims || g.pads.size() != 2 * dims)
    fail("dilations and strides need " + std::to_string(dims) + " values and pads " + std::to_string(2 * dims));
  g.block_size = 1;
  g.blocks = 1;
  for (size_t d = 0; d < dims; ++d) {
    if (image[d] < 1 || block[d] < 1 || g.dilations[d] < 1 || g.strides[d] < 1 || g.pads[d] < 0 || g.pads[d + dims] < 0)
      fail("image_shape, block_shape, dilations and strides must be positive and pads not negative");
    const int64_t span = checked_add(checked_mul(g.dilations[d], block[d] - 1, "Col2Im's block span"), 1, "Col2Im's block span");
    const int64_t padded = checked_add(image[d], checked_add(g.pads[d], g.pads[d + dims], "Col2Im's pads"), "Col2Im's padded image");
    if (padded < span) fail("a block of " + std::to_string(span) + " does not fit the padded image of " + std::to_string(padded));
    g.per_dim.push_back((padded - span) / g.strides[d] + 1);
    g.block_size = checked_mul(g.block_size, block[d], "Col2Im's block size");
    g.blocks = checked_mul(g.blocks, g.per_dim.back(), "Col2Im's block count");
  }
  return g;
}

namespace {

void infer_col2im(InferContext& ctx) {
  const TensorType& x = ctx.type(0);
  if (!is_float(x.dtype) && !is_integer(x.dtype)) ctx.fail("input type " + to_string(x.dtype) + " is not numeric");
  for (size_t i = 1; i < 3; ++i)
    if (ctx.dtype(i) != DType::kInt64) ctx.fail("input " + std::to_string(i) + " must be int64");
  const std::optional<Dims> image = ctx.int_elements(1), block = ctx.int_elements(2);
  if (!image || !block || !all_known(*image) || !all_known(*block)) {
    // Known when the engine runs (the CPU engine infers shapes again then); the rank is known now
    // where image_shape's length is.
    const bool rank_known = ctx.shape_known(1) && ctx.shape(1).size() == 1 && ctx.shape(1)[0].known();
    if (rank_known) ctx.set_output(0, x.dtype, unknown_dims(ctx, ctx.shape(1)[0].value + 2));
    else ctx.set_output(0, x.dtype, std::nullopt);
    return;
  }
  const Col2ImGeometry g = col2im_geometry(ctx.node, known_values(*image), known_values(*block));
  if (!x.shape) {
    ctx.set_output(0, x.dtype, std::nullopt);
    return;
  }
  const Dims& s = *x.shape;
  if (s.size() != 3) ctx.fail("input must have shape [N, C * prod(block_shape), L], has " + dims_to_string(s));
  if (s[1].known() && s[1].value % g.block_size != 0)
    ctx.fail("input dim 1 (" + s[1].str() + ") is not a multiple of the block size " + std::to_string(g.block_size));
  if (s[2].known() && s[2].value != g.blocks)
    ctx.fail("input dim 2 (" + s[2].str() + ") must be the number of blocks, " + std::to_string(g.blocks));
  Dims out{s[0], s[1].known() ? Dim(s[1].value / g.block_size) : Dim::unknown()};
  for (int64_t v : g.image) out.push_back(Dim(v));
  ctx.set_output(0, x.dtype, out);
}

}  // namespace

KILN_REGISTER_OPS(col2im) {
  OpSchema s;
  s.op = "Col2Im";
  s.min_inputs = s.max_inputs = 3;
  s.infer = infer_col2im;
  s.flops = [](const FlopsContext& c) { return FlopsContext::numel(c.input_types[0]); };
  s.limits = "GPU: no layer";
  registry.add(std::move(s));
}

}  // namespace kiln::ir
