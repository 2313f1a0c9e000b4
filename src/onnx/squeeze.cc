// Importers of Squeeze and Unsqueeze: before opset 13 the axes were an attribute; the IR
// takes them as input 1.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(squeeze) {
  for (const char* op : {"Squeeze", "Unsqueeze"})
    registry.add({op, kOldestOpset, [](ImportContext& ctx) {
                    if (ctx.opset < 13) ctx.move_ints_attribute_to_input("axes", 1);
                    if (ctx.node.op == "Unsqueeze" && !ctx.node.has_input(1))
                      ctx.fail("Unsqueeze needs axes");
                    ctx.emit_as_is();
                  }});
}

}  // namespace kiln::onnx_import
