// Schemas of Transpose, DepthToSpace and SpaceToDepth (permutations of the elements).
#include "ir/sizes.h"
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_transpose(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  if (!ctx.shape_known(0)) {
    ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  const Dims& in = ctx.shape(0);
  size_t rank = in.size();
  std::vector<int64_t> perm = ctx.node.attrs.get_ints("perm");
  if (!ctx.node.attrs.has("perm"))
    for (size_t i = 0; i < rank; ++i) perm.push_back(static_cast<int64_t>(rank - 1 - i));
  if (perm.size() != rank)
    ctx.fail("perm has " + std::to_string(perm.size()) + " entries for an input of rank " + std::to_string(rank));
  std::vector<bool> seen(rank, false);
  Dims out;
  for (int64_t p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(rank) || seen[static_cast<size_t>(p)])
      ctx.fail("perm is not a permutation of 0.." + std::to_string(rank - 1));
    seen[static_cast<size_t>(p)] = true;
    out.push_back(in[static_cast<size_t>(p)]);
  }
  ctx.set_output(0, dtype, out);
}

// A dim times the block (size): past int64 it is refused (fuzz_graph: 2^62 * 2).
Dim mul(InferContext& ctx, const Dim& d, int64_t k) {
  if (!d.known()) return k == 1 ? d : Dim::unknown();
  try {
    return Dim(checked_mul(d.value, k, "a dim times the block"));
  } catch (const Error& error) {
    ctx.fail(error.message());
  }
}
Dim div(InferContext& ctx, const Dim& d, int64_t k, const char* what) {
  if (!d.known()) return k == 1 ? d : Dim::unknown();
  if (d.value % k != 0)
    ctx.fail(std::string(what) + " " + std::to_string(d.value) + " is not divisible by " + std::to_string(k));
  return Dim(d.value / k);
}

void infer_depth_space(InferContext& ctx) {
  DType dtype = ctx.dtype(0);
  const Dims& in = ctx.shape(0);
  if (in.size() != 4) ctx.fail("the input must be 4-D (NCHW), is " + dims_to_string(in));
  int64_t b = ctx.node.attrs.require_int("blocksize");
  if (b <= 0 || b > (1 << 20)) ctx.fail("blocksize must be positive (and sane)");
  if (ctx.node.op == "DepthToSpace") {
    std::string mode = ctx.node.attrs.get_string("mode", "DCR");
    if (mode != "DCR" && mode != "CRD") ctx.fail("mode must be DCR or CRD, is '" + mode + "'");
    ctx.set_output(0, dtype, Dims{in[0], div(ctx, in[1], b * b, "channel count"), mul(ctx, in[2], b), mul(ctx, in[3], b)});
  } else {
    ctx.set_output(0, dtype, Dims{in[0], mul(ctx, in[1], b * b), div(ctx, in[2], b, "height"), div(ctx, in[3], b, "width")});
  }
}

}  // namespace

KILN_REGISTER_OPS(transpose) {
  registry.add({"Transpose", "", 1, 1, 1, 1, infer_transpose, nullptr, ""});
  registry.add({"DepthToSpace", "", 1, 1, 1, 1, infer_depth_space, nullptr, "4-D input only"});
  registry.add({"SpaceToDepth", "", 1, 1, 1, 1, infer_depth_space, nullptr, "4-D input only"});
}

}  // namespace kiln::ir
