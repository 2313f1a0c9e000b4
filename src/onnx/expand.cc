// Importers of Expand and Tile: taken as they are.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(expand) {
  registry.add({"Expand", kMinOpset, nullptr});
  registry.add({"Tile", kMinOpset, nullptr});
}

}  // namespace kiln::onnx_import
