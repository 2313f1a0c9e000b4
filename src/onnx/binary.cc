// Importers of broadcasting elementwise ops, taken as they are from the opset where their
// meaning settled: numpy broadcasting arrived in opset 7 (8 for the variadic Max, Min, Sum and
// Mean); later opsets only added types.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(binary) {
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "PRelu", "Equal", "Less", "Greater", "And", "Or", "Xor"})
    registry.add({op, 7, nullptr});
  for (const char* op : {"Max", "Min", "Sum", "Mean"}) registry.add({op, 8, nullptr});
  registry.add({"Where", 9, nullptr});
  registry.add({"Mod", 10, nullptr});
  registry.add({"BitShift", 11, nullptr});
  registry.add({"LessOrEqual", 12, nullptr});
  registry.add({"GreaterOrEqual", 12, nullptr});
}

}  // namespace kiln::onnx_import
