// Importers of broadcasting elementwise ops. Opsets 11..28 share one meaning for all of them
// (numpy broadcasting arrived in opset 7), so they are taken as they are.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(binary) {
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "BitShift", "PRelu", "Equal",
                         "Less", "Greater", "And", "Or", "Xor", "Max", "Min", "Sum", "Mean", "Where"})
    registry.add({op, kMinOpset, nullptr});
  registry.add({"LessOrEqual", 12, nullptr});
  registry.add({"GreaterOrEqual", 12, nullptr});
}

}  // namespace kiln::onnx_import
