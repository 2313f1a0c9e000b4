// Schema of Det: the determinants of the square matrices in the input's last two dims.
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_det(InferContext& ctx) {
  const DType dtype = ctx.dtype(0);
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64 && dtype != DType::kFloat16 && dtype != DType::kBFloat16)
    ctx.fail("Det takes floating point matrices");
  if (!ctx.shape_known(0)) {
    ctx.set_output(0, dtype, std::nullopt);
    return;
  }
  const Dims& x = ctx.shape(0);
  if (x.size() < 2) ctx.fail("the input must have rank >= 2");
  const Dim &m = x[x.size() - 2], &n = x[x.size() - 1];
  if (m.known() && n.known() && m.value != n.value) ctx.fail("the matrices must be square");
  ctx.set_output(0, dtype, Dims(x.begin(), x.end() - 2));
}

}  // namespace

KILN_REGISTER_OPS(det) {
  registry.add({"Det", "", 1, 1, 1, 1, infer_det, nullptr, ""});
}

}  // namespace kiln::ir
