// Importer of Split: before opset 13 the sizes were the `split` attribute; the IR takes them
// as input 1.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(split) {
  registry.add({"Split", kOldestOpset, [](ImportContext& ctx) {
                  if (ctx.opset < 13) ctx.move_ints_attribute_to_input("split", 1);
                  ctx.emit_as_is();
                }});
}

}  // namespace kiln::onnx_import
