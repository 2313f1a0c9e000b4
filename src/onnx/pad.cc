// Importer of Pad: from opset 11 on pads and constant_value are inputs, as the IR wants.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(pad) { registry.add({"Pad", kMinOpset, nullptr}); }

}  // namespace kiln::onnx_import
