// Importer of Resize: from opset 11 on, roi/scales/sizes are inputs, as the IR wants.
// (Upsample was removed in opset 10, so no model kiln reads has it.)
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(resize) { registry.add({"Resize", kMinOpset, nullptr}); }

}  // namespace kiln::onnx_import
