// Importer of MatMul: unchanged since opset 9 apart from types.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(matmul) { registry.add({"MatMul", kMinOpset, nullptr}); }

}  // namespace kiln::onnx_import
