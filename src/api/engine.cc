// The public API (include/kiln/kiln.h) over the importer, the passes and the CPU engine.
#include "kiln/kiln.h"

#include "cpu/engine.h"
#include "onnx/importer.h"
#include "passes/pipeline.h"

namespace kiln {

struct Engine::Impl {
  std::unique_ptr<cpu::CpuEngine> cpu;
  std::vector<TensorDesc> inputs;
  std::vector<TensorDesc> outputs;
};

namespace {
TensorDesc describe(const ir::Graph& g, const std::string& name) {
  TensorDesc d;
  d.name = name;
  const ir::Value& v = g.value(name);
  d.dtype = v.type.dtype;
  if (v.type.shape) {
    for (const ir::Dim& dim : *v.type.shape) {
      d.shape.push_back(dim.known() ? dim.value : -1);
      d.dim_names.push_back(dim.known() ? "" : dim.symbol);
    }
  }
  return d;
}
}  // namespace

Engine Engine::from_onnx(const std::string& onnx_path, const BuildOptions& options) {
  ir::Graph graph = onnx_import::import_file(onnx_path);
  try {
    if (options.optimize) passes::optimize(graph);
  } catch (Error& e) {
    if (e.file_path().empty()) e.file(onnx_path);
    throw;
  }
  auto impl = std::make_shared<Impl>();
  for (const std::string& in : graph.inputs) impl->inputs.push_back(describe(graph, in));
  for (const std::string& out : graph.outputs) impl->outputs.push_back(describe(graph, out));
  try {
    impl->cpu = std::make_unique<cpu::CpuEngine>(std::move(graph));
  } catch (Error& e) {
    if (e.file_path().empty()) e.file(onnx_path);
    throw;
  }
  return Engine(std::move(impl));
}

const std::vector<TensorDesc>& Engine::inputs() const { return impl_->inputs; }
const std::vector<TensorDesc>& Engine::outputs() const { return impl_->outputs; }
std::string Engine::backend() const { return "cpu"; }
size_t Engine::layer_count() const { return impl_->cpu->graph().nodes.size(); }

std::map<std::string, Tensor> Engine::run(const std::map<std::string, Tensor>& inputs) const {
  return impl_->cpu->run(inputs);
}

}  // namespace kiln
