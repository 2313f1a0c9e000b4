// Importers of Gather, GatherElements, GatherND and ScatterElements: taken as they are
// (ScatterElements' reduction attribute, opset 16, defaults to the old behaviour).
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(gather) {
  for (const char* op : {"Gather", "GatherElements", "GatherND", "ScatterElements"}) registry.add({op, kMinOpset, nullptr});
}

}  // namespace kiln::onnx_import
