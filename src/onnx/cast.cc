// Importer of Dropout (Cast, CastLike and Clip are taken as they are: as_is.cc).
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(cast) {
  registry.add({"Dropout", kOldestOpset, [](ImportContext& ctx) {
                  // Opset 11 keeps the ratio as an attribute; at inference the ratio changes
                  // nothing, so it is dropped rather than turned into an input.
                  ctx.node.attrs.erase("ratio");
                  ctx.emit_as_is();
                }});
}

}  // namespace kiln::onnx_import
