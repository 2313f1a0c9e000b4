// Importers of pooling ops. Opsets 11..28 only add attributes with defaults that keep the
// older meaning (AveragePool dilations in 19, LpPool ceil_mode/dilations in 18), so every
// form is taken as it is.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(pool) {
  for (const char* op : {"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
    registry.add({op, kMinOpset, nullptr});
}

}  // namespace kiln::onnx_import
