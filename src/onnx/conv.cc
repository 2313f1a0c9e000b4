// Importers of Conv and ConvTranspose: their opset 11+ forms are the IR form.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(conv) {
  registry.add({"Conv", kMinOpset, nullptr});
  registry.add({"ConvTranspose", kMinOpset, nullptr});
}

}  // namespace kiln::onnx_import
