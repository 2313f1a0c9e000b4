// Importer of Gemm: since opset 11 C is optional, which is the IR form.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(gemm) { registry.add({"Gemm", kMinOpset, nullptr}); }

}  // namespace kiln::onnx_import
