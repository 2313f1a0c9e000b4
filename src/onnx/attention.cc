// Importer of ONNX's Attention (opset 23 on): taken as it is (ops/attention_params.h).
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(attention) { registry.add({"Attention", 23, nullptr}); }

}  // namespace kiln::onnx_import
