// kiln::simplify_onnx (import, fold, write ONNX again) and kiln::model_inputs: what the public
// API offers of a model without building an engine.
#include <fstream>

#include "compiler/pipeline.h"
#include "kiln/kiln.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"

namespace kiln {

SimplifyResult simplify_onnx(const std::string& onnx_path, const std::string& output_path) {
  ir::Graph graph = onnx_import::import_file(onnx_path);
  SimplifyResult result;
  result.nodes_before = graph.nodes.size();
  compiler::PassOptions fold_only;
  fold_only.fuse_epilogue = false;  // kiln's fused ops have no ONNX form
  fold_only.fuse_attention = false;  // Attention needs opset 23, which the model may predate
  compiler::optimize(graph, fold_only);
  result.nodes_after = graph.nodes.size();
  const std::string bytes = onnx_export::export_model(graph);
  std::ofstream out(output_path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(ErrorKind::kIo, "cannot write '" + output_path + "'");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) throw Error(ErrorKind::kIo, "cannot write '" + output_path + "' (disk full?)");
  return result;
}

std::vector<TensorDesc> model_inputs(const std::string& onnx_path) {
  const ir::Graph graph = onnx_import::import_file(onnx_path);
  std::vector<TensorDesc> out;
  for (const std::string& name : graph.inputs) out.push_back(compiler::describe(graph, name));
  return out;
}

}  // namespace kiln
