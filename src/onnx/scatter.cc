// Importer of Scatter, deprecated in opset 11: ScatterElements has its meaning (opset 11's
// ScatterElements without reduction), so the node becomes one.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(scatter) {
  registry.add({"Scatter", 9, [](ImportContext& ctx) {
                  ctx.node.op = "ScatterElements";
                  ctx.emit_as_is();
                }});
}

}  // namespace kiln::onnx_import
