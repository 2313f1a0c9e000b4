// Importers of Reshape and Flatten: both already take their newest form at opset 11
// (allowzero, added in opset 14, defaults to the old behaviour).
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(reshape) {
  registry.add({"Reshape", kMinOpset, nullptr});
  registry.add({"Flatten", kMinOpset, nullptr});
}

}  // namespace kiln::onnx_import
