// Importer of RoiAlign: opset 10's behaviour, which opset 16 names coordinate_transformation_mode
// "output_half_pixel" (16's default is "half_pixel"), is written out, so the schema and kernels
// read one form.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(roi_align) {
  registry.add({"RoiAlign", 10, [](ImportContext& ctx) {
                  if (ctx.opset < 16) ctx.node.attrs.set("coordinate_transformation_mode", std::string("output_half_pixel"));
                  ctx.emit_as_is();
                }});
}

}  // namespace kiln::onnx_import
