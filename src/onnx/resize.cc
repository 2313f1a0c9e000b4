// Importers of Resize and of its forerunner Upsample, into opset 11's Resize (X, roi, scales,
// sizes). Upsample (opset 7: scales an attribute; 9: an input; deprecated since 10) and opset
// 10's Resize map output index i to input coordinate i / scale ("asymmetric") and take the
// nearest pixel by truncation (ONNX Runtime's, and the repetition ONNX's reference gives for
// whole scales): nearest_mode "floor" when every scale is at least 1. Shrinking, where ONNX
// Runtime rounds up instead, takes "ceil" when every scale is at most 1; scales that do both,
// or that are not constant in a shrinking Resize, are refused.
#include <string>
#include <vector>

#include "onnx/importer.h"

namespace kiln::onnx_import {

namespace {

void to_opset_11_resize(ImportContext& ctx) {
  ir::Node& n = ctx.node;
  const std::string mode = n.attrs.get_string("mode", "nearest");
  if (mode != "nearest" && mode != "linear")
    ctx.fail("mode must be nearest or linear at opset " + std::to_string(ctx.opset) + ", is '" + mode + "'");
  if (n.inputs.empty() || n.inputs[0].empty()) ctx.fail(n.op + " needs its input X");
  std::string scales = n.inputs.size() > 1 ? n.inputs[1] : "";
  if (n.op == "Upsample" && ctx.opset < 9) {
    if (!n.attrs.has("scales")) ctx.fail("Upsample needs its scales attribute at opset " + std::to_string(ctx.opset));
    const std::vector<float> values = n.attrs.get_floats("scales");
    Tensor t(DType::kFloat32, {static_cast<int64_t>(values.size())});
    for (size_t i = 0; i < values.size(); ++i) t.data<float>()[i] = values[i];
    n.attrs.erase("scales");
    scales = ctx.graph.add_constant(n.name + "_scales", t);
  }
  if (scales.empty()) ctx.fail(n.op + " needs its scales input");
  std::string nearest = "floor";
  if (mode == "nearest") {
    const ir::Value* v = ctx.graph.find_value(scales);
    const Tensor* known = v && v->constant ? &*v->constant : nullptr;
    // (Upsample's scales are at least 1 by definition; a Resize's may shrink.)
    if (!known && n.op == "Resize")
      ctx.unsupported("nearest resizing with scales that are not constant at opset " + std::to_string(ctx.opset) +
                      " (whether it rounds down or up depends on them)");
    bool grows = true, shrinks = true;
    for (int64_t i = 0; known && i < known->numel(); ++i) {
      const double s = known->value_as_double(i);
      grows = grows && s >= 1, shrinks = shrinks && s <= 1;
    }
    if (!grows && !shrinks)
      ctx.unsupported("nearest resizing that enlarges some axes and shrinks others at opset " + std::to_string(ctx.opset));
    nearest = grows ? "floor" : "ceil";
  }
  n.op = "Resize";
  n.inputs = {n.inputs[0], "", scales};
  n.attrs.set("mode", mode);
  n.attrs.set("coordinate_transformation_mode", std::string("asymmetric"));
  n.attrs.set("nearest_mode", nearest);
  ctx.emit_as_is();
}

}  // namespace

KILN_REGISTER_IMPORTERS(resize) {
  registry.add({"Resize", 10, [](ImportContext& ctx) {
                  if (ctx.opset >= 11) ctx.emit_as_is();
                  else to_opset_11_resize(ctx);
                }});
  registry.add({"Upsample", kOldestOpset, to_opset_11_resize, "Resize"});
}

}  // namespace kiln::onnx_import
