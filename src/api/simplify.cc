// kiln::simplify_onnx: import, fold, write ONNX again.
#include <fstream>

#include "kiln/kiln.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "passes/pipeline.h"

namespace kiln {

SimplifyResult simplify_onnx(const std::string& onnx_path, const std::string& output_path) {
  ir::Graph graph = onnx_import::import_file(onnx_path);
  SimplifyResult result;
  result.nodes_before = graph.nodes.size();
  passes::PassOptions fold_only;
  fold_only.fuse_epilogue = false;  // kiln's fused ops have no ONNX form
  passes::optimize(graph, fold_only);
  result.nodes_after = graph.nodes.size();
  const std::string bytes = onnx_export::export_model(graph);
  std::ofstream out(output_path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(ErrorKind::kIo, "cannot write '" + output_path + "'");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) throw Error(ErrorKind::kIo, "cannot write '" + output_path + "' (disk full?)");
  return result;
}

}  // namespace kiln
