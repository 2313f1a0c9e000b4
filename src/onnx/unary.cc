// Importers of elementwise unary ops: all take the ONNX node as it is.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(unary) {
  for (const char* op : {"Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Erf",
                         "Abs", "Neg", "Floor", "Ceil", "Round", "Sin", "Cos", "Elu",
                         "LeakyRelu", "Selu", "Softplus", "Softsign", "HardSigmoid", "Sign",
                         "Celu", "Mish", "ThresholdedRelu", "Identity", "Not", "Tan", "Asin",
                         "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "IsNaN", "IsInf"})
    registry.add({op, kMinOpset, nullptr});
  registry.add({"HardSwish", 14, nullptr});
  registry.add({"Gelu", 20, nullptr});
}

}  // namespace kiln::onnx_import
