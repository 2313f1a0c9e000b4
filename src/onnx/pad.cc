// Importers of Pad, Slice and Clip, whose parameters were attributes in older opsets and are
// inputs in the IR, as in the newest: Pad's pads and value before opset 11, Slice's starts, ends
// and axes before 10, Clip's min and max before 11.
#include <limits>

#include "onnx/importer.h"

namespace kiln::onnx_import {

namespace {

// A float attribute as a new scalar constant input at `index`, of the data's type where the
// model declares it (Pad and Clip took only float types while their parameters were attributes).
void float_attribute_to_input(ImportContext& ctx, const std::string& attr, float fallback, size_t index) {
  ir::Node& n = ctx.node;
  const float v = n.attrs.get_float(attr, fallback);
  n.attrs.erase(attr);
  const ir::Value* data = ctx.graph.find_value(n.inputs.at(0));
  const DType dtype = data && data->type.dtype != DType::kUndefined ? data->type.dtype : DType::kFloat32;
  Tensor t = Tensor::scalar<float>(v);
  if (dtype == DType::kFloat64) t = Tensor::scalar<double>(v);
  else if (dtype == DType::kFloat16) {
    t = Tensor(DType::kFloat16, {});
    static_cast<uint16_t*>(t.raw())[0] = float_to_half(v);
  } else if (dtype != DType::kFloat32) {
    ctx.unsupported(attr + " of a " + to_string(dtype) + " input at opset " + std::to_string(ctx.opset));
  }
  const std::string name = ctx.graph.add_constant(n.name + "_" + attr, t);
  if (n.inputs.size() <= index) n.inputs.resize(index + 1);
  n.inputs[index] = name;
}

}  // namespace

KILN_REGISTER_IMPORTERS(pad) {
  registry.add({"Pad", kOldestOpset, [](ImportContext& ctx) {
                  if (ctx.opset < 11) {
                    ctx.move_ints_attribute_to_input("pads", 1);
                    float_attribute_to_input(ctx, "value", 0.f, 2);
                  }
                  ctx.emit_as_is();
                }});
  registry.add({"Slice", kOldestOpset, [](ImportContext& ctx) {
                  if (ctx.opset < 10) {
                    if (!ctx.node.attrs.has("starts") || !ctx.node.attrs.has("ends")) ctx.fail("Slice needs starts and ends");
                    ctx.move_ints_attribute_to_input("starts", 1);
                    ctx.move_ints_attribute_to_input("ends", 2);
                    ctx.move_ints_attribute_to_input("axes", 3);
                  }
                  ctx.emit_as_is();
                }});
  registry.add({"Clip", kOldestOpset, [](ImportContext& ctx) {
                  if (ctx.opset < 11) {
                    float_attribute_to_input(ctx, "min", std::numeric_limits<float>::lowest(), 1);
                    float_attribute_to_input(ctx, "max", std::numeric_limits<float>::max(), 2);
                  }
                  ctx.emit_as_is();
                }});
}

}  // namespace kiln::onnx_import
