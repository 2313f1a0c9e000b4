// Importers of Softmax and LogSoftmax (the normalization ops are taken as they are: as_is.cc).
//
// Before opset 13, Softmax(axis) flattened the input to 2-D at `axis` (default 1) and
// normalized each row over all dims from `axis` on. The IR has opset 13's per-axis meaning,
// so the old form becomes Flatten -> Softmax(axis=-1) -> Reshape(Shape(x)), or a plain
// Softmax(axis=-1) when `axis` is already the last dim (the same computation).
#include "onnx/importer.h"

namespace kiln::onnx_import {

namespace {

void import_softmax(ImportContext& ctx) {
  ir::Node& node = ctx.node;
  if (ctx.opset >= 13) {
    ctx.emit_as_is();
    return;
  }
  int64_t axis = node.attrs.get_int("axis", 1);
  const ir::Value* x = ctx.graph.find_value(node.inputs.at(0));
  int rank = x ? x->type.rank() : -1;
  if (rank >= 0 && (axis < -rank || axis >= std::max(rank, 1)))
    ctx.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  if (rank >= 0 && axis < 0) axis += rank;
  if (rank >= 0 && axis >= rank - 1) {
    node.attrs.set("axis", int64_t{-1});
    ctx.emit_as_is();
    return;
  }
  if (rank < 0 && axis < 0)
    ctx.unsupported("a negative axis on an input of unknown rank (opset " + std::to_string(ctx.opset) + " Softmax)");
  const std::string in = node.inputs[0], out = node.outputs.at(0);
  ir::Node shape{node.name + "_shape", "Shape", "", {in}, {ctx.graph.unique_name(out + "_shape")}, {}};
  ir::Node flatten{node.name + "_flatten", "Flatten", "", {in}, {ctx.graph.unique_name(out + "_2d")}, {}};
  flatten.attrs.set("axis", axis);
  ir::Node softmax = node;
  softmax.inputs = {flatten.outputs[0]};
  softmax.outputs = {ctx.graph.unique_name(out + "_rows")};
  softmax.attrs.set("axis", int64_t{-1});
  ir::Node reshape{node.name + "_reshape", "Reshape", "", {softmax.outputs[0], shape.outputs[0]}, {out}, {}};
  ctx.emit(std::move(shape));
  ctx.emit(std::move(flatten));
  ctx.emit(std::move(softmax));
  ctx.emit(std::move(reshape));
}

}  // namespace

KILN_REGISTER_IMPORTERS(normalization) {
  registry.add({"Softmax", kOldestOpset, import_softmax});
  registry.add({"LogSoftmax", kOldestOpset, import_softmax});
  registry.add({"Hardmax", kOldestOpset, import_softmax});
}

}  // namespace kiln::onnx_import
