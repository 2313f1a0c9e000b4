// Importers of reductions (ArgMax and ArgMin are taken as they are: as_is.cc). Before opset 18
// (ReduceSum: 13) `axes` was an attribute; the IR takes it as input 1, as newer opsets do.
#include <string>

#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(reduce) {
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}) {
    const int axes_input_since = std::string(op) == "ReduceSum" ? 13 : 18;
    registry.add({op, kOldestOpset, [axes_input_since](ImportContext& ctx) {
                    if (ctx.opset < axes_input_since) ctx.move_ints_attribute_to_input("axes", 1);
                    else if (ctx.node.attrs.has("axes")) ctx.fail("axes is an input since opset " + std::to_string(axes_input_since) + ", not an attribute");
                    ctx.emit_as_is();
                  }});
  }
}

}  // namespace kiln::onnx_import
