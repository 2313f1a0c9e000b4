// Schemas of the window functions HannWindow, HammingWindow and BlackmanWindow: a 1-D tensor of
// `size` (a scalar input) values of output_datatype (float32 by default; float64 too).
#include "ops/shape_dims.h"

namespace kiln::ir {

namespace {

void infer_window(InferContext& ctx) {
  if (ctx.dtype(0) != DType::kInt32 && ctx.dtype(0) != DType::kInt64) ctx.fail("size must be int32 or int64");
  const int64_t code = ctx.node.attrs.get_int("output_datatype", static_cast<int64_t>(DType::kFloat32));
  if (code != static_cast<int64_t>(DType::kFloat32) && code != static_cast<int64_t>(DType::kFloat64))
    ctx.unsupported("output_datatype " + std::to_string(code) + " (float32 and float64 are supported)");
  Dim size = Dim::unknown();
  if (const Tensor* t = ctx.value(0)) {
    if (t->numel() != 1) ctx.fail("size must be a scalar");
    const int64_t v = t->value_as_int(0);
    if (v < 0 || v > (int64_t{1} << 28)) ctx.fail("size " + std::to_string(v) + " is outside [0, 2^28]");
    size = Dim(v);
  }
  ctx.set_output(0, static_cast<DType>(code), Dims{size});
}

}  // namespace

KILN_REGISTER_OPS(window) {
  for (const char* op : {"HannWindow", "HammingWindow", "BlackmanWindow"})
    registry.add({op, "", 1, 1, 1, 1, infer_window, nullptr, ""});
}

}  // namespace kiln::ir
