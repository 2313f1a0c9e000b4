// Importer of Concat: taken as it is.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(concat) { registry.add({"Concat", kMinOpset, nullptr}); }

}  // namespace kiln::onnx_import
