// Importer of GridSample: opset 16's mode names (bilinear, bicubic) become opset 20's (linear,
// cubic), the semantics the schema and kernels read.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(grid_sample) {
  registry.add({"GridSample", 16, [](ImportContext& ctx) {
                  const std::string mode = ctx.node.attrs.get_string("mode", ctx.opset >= 20 ? "linear" : "bilinear");
                  ctx.node.attrs.set("mode", mode == "bilinear" ? std::string("linear")
                                             : mode == "bicubic" ? std::string("cubic") : mode);
                  ctx.emit_as_is();
                }});
}

}  // namespace kiln::onnx_import
