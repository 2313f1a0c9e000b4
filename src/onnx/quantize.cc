// Importers of QuantizeLinear and DequantizeLinear (explicit quantization, QDQ models).
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(quantize) {
  // Opset 10's forms are per-tensor; 13 added `axis` (per-channel scales), 21 `block_size` and
  // `output_dtype`: the attributes mean the same in every opset kiln reads.
  registry.add({"QuantizeLinear", kMinOpset, nullptr});
  registry.add({"DequantizeLinear", kMinOpset, nullptr});
}

}  // namespace kiln::onnx_import
