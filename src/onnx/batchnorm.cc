// Importer of BatchNormalization. Before opset 9 a `spatial` attribute chose per-channel
// statistics (1, the default, the only form kiln runs). Before opset 14 there was no training_mode attribute: the
// optional outputs (running mean/var, saved mean/var) were what asked for training, so a node
// that uses them is marked training_mode=1 (which the schema rejects with a clear reason).
// Trailing unused outputs are dropped so the IR node has just Y in inference mode.
#include "onnx/importer.h"

namespace kiln::onnx_import {

KILN_REGISTER_IMPORTERS(batchnorm) {
  registry.add({"BatchNormalization", kOldestOpset, [](ImportContext& ctx) {
                  ir::Node& n = ctx.node;
                  // Opsets 7 and 8: spatial=0 normalized every element apart, not per channel.
                  if (ctx.opset < 9 && n.attrs.get_int("spatial", 1) == 0)
                    ctx.unsupported("spatial=0 (per-element statistics, before opset 9) is not supported");
                  n.attrs.erase("spatial");
                  while (n.outputs.size() > 1 && n.outputs.back().empty()) n.outputs.pop_back();
                  if (ctx.opset < 14 && n.outputs.size() > 1) n.attrs.set("training_mode", int64_t{1});
                  n.attrs.erase("momentum");  // only used in training
                  ctx.emit_as_is();
                }});
}

}  // namespace kiln::onnx_import
