// Importers of Transpose, DepthToSpace and SpaceToDepth: taken as they are.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(transpose) {
  for (const char* op : {"Transpose", "DepthToSpace", "SpaceToDepth"}) registry.add({op, kMinOpset, nullptr});
}

}  // namespace kiln::onnx_import
