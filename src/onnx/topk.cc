// Importers of TopK, Trilu, CumSum, OneHot, NonZero: taken as they are (TopK's K is an input
// from opset 10 on).
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(topk) {
  registry.add({"TopK", kMinOpset, nullptr});
  registry.add({"Trilu", 14, nullptr});
  registry.add({"CumSum", kMinOpset, nullptr});
  registry.add({"OneHot", kMinOpset, nullptr});
  registry.add({"NonZero", kMinOpset, nullptr});
}

}  // namespace kiln::onnx_import
