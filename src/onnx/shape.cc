// Importers of Shape and Size: taken as they are (Shape's start/end arrive as attributes).
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(shape) {
  registry.add({"Shape", kMinOpset, nullptr});
  registry.add({"Size", kMinOpset, nullptr});
}

}  // namespace kiln::onnx_import
