// Importer of Slice: from opset 10 on, starts/ends/axes/steps are inputs, as the IR wants.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(slice) { registry.add({"Slice", kMinOpset, nullptr}); }

}  // namespace kiln::onnx_import
