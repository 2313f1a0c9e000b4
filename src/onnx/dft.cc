// Importer of DFT: before opset 20 the axis was an attribute (default 1); the IR takes it as
// input 2, a scalar, as opset 20 does (whose default, when the input is absent, is -2).
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(dft) {
  registry.add({"DFT", 17, [](ImportContext& ctx) {
                  if (ctx.opset < 20) {
                    const int64_t axis = ctx.node.attrs.get_int("axis", 1);
                    ctx.node.attrs.erase("axis");
                    const std::string name = ctx.graph.add_constant(ctx.node.name + "_axis", Tensor::scalar<int64_t>(axis));
                    if (ctx.node.inputs.size() < 3) ctx.node.inputs.resize(3);
                    ctx.node.inputs[2] = name;
                  }
                  ctx.emit_as_is();
                }});
}

}  // namespace kiln::onnx_import
