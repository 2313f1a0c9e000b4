// Importers of Cast, CastLike, Clip and Dropout.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(cast) {
  registry.add({"Cast", kMinOpset, nullptr});
  registry.add({"CastLike", 15, nullptr});
  // Clip has taken min and max as inputs since opset 11, the oldest kiln reads.
  registry.add({"Clip", kMinOpset, nullptr});
  registry.add({"Dropout", kMinOpset, [](ImportContext& ctx) {
                  // Opset 11 keeps the ratio as an attribute; at inference the ratio changes
                  // nothing, so it is dropped rather than turned into an input.
                  ctx.node.attrs.erase("ratio");
                  ctx.emit_as_is();
                }});
}

}  // namespace kiln::onnx_import
