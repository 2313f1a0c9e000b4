// Importers of Gather, GatherElements, GatherND, ScatterElements and ScatterND: taken as they
// are (the scatters' reduction attribute, opset 16, defaults to the old behaviour).
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(gather) {
  for (const char* op : {"Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND"}) registry.add({op, kMinOpset, nullptr});
}

}  // namespace kiln::onnx_import
