// CPU kernel of If (kiln's form: src/ops/control_flow.cc): each branch, a self-contained ONNX
// model, is imported and built into a CPU engine of its own when the kernel is made, its inputs
// typed as the node's inputs are here; a run runs the branch the condition picks on the node's
// inputs and hands on its outputs, whose shapes only that run decides.
#include <onnx.pb.h>

#include <memory>

#include "cpu/engine.h"
#include "cpu/kernel.h"
#include "onnx/importer.h"

namespace kiln::cpu {

namespace {

class IfKernel : public Kernel {
 public:
  explicit IfKernel(const KernelInit& init) : node_(init.node) {
    branches_[1] = build(init, "then_model");
    branches_[0] = build(init, "else_model");
  }

  void run(const std::vector<const Tensor*>& inputs, std::vector<Tensor>& outputs) override {
    const Tensor& cond = *inputs[0];
    if (cond.numel() != 1)
      throw node_.error(ErrorKind::kInvalidArgument, "the condition holds " + std::to_string(cond.numel()) + " values, not one");
    const Branch& branch = branches_[cond.value_as_double(0) != 0 ? 1 : 0];
    std::map<std::string, Tensor> feed;
    for (size_t i = 0; i < branch.inputs.size(); ++i) feed[branch.inputs[i]] = *inputs[i + 1];
    std::map<std::string, Tensor> result = branch.engine->run(feed);
    for (size_t o = 0; o < outputs.size(); ++o) {
      Tensor& out = result.at(branch.outputs[o]);
      if (out.dtype() != declared_[o])
        throw node_.error(ErrorKind::kInvalidModel, "its branch's output " + std::to_string(o) + " is " + to_string(out.dtype()) +
                                                        ", not the declared " + to_string(declared_[o]));
      outputs[o] = std::move(out);
    }
  }

 private:
  struct Branch {
    std::unique_ptr<CpuEngine> engine;
    std::vector<std::string> inputs, outputs;
  };

  Branch build(const KernelInit& init, const std::string& attr) {
    onnx::ModelProto model;
    const std::string bytes = init.node.attrs.get_string(attr, "");
    if (bytes.empty() || !model.ParseFromString(bytes))
      throw init.node.error(ErrorKind::kInvalidModel, attr + " is not an ONNX model");
    onnx::GraphProto* graph = model.mutable_graph();
    if (static_cast<size_t>(graph->input_size()) + 1 != init.input_types.size())
      throw init.node.error(ErrorKind::kInvalidModel, attr + " has " + std::to_string(graph->input_size()) +
                                                          " inputs; the node gives it " + std::to_string(init.input_types.size() - 1));
    // The branch's inputs take the types of the node's inputs; dims not known here get names
    // of their own, so the branch engine takes any size there.
    for (int i = 0; i < graph->input_size(); ++i) {
      const ir::TensorType* type = init.input_types[static_cast<size_t>(i) + 1];
      onnx::ValueInfoProto* input = graph->mutable_input(i);
      if (!type || !type->shape)
        throw init.node.error(ErrorKind::kUnsupported, "the rank of input '" + input->name() + "' is not known when building");
      onnx::TypeProto::Tensor* tensor = input->mutable_type()->mutable_tensor_type();
      tensor->set_elem_type(static_cast<int32_t>(type->dtype));
      onnx::TensorShapeProto* shape = tensor->mutable_shape();
      shape->clear_dim();
      for (size_t k = 0; k < type->shape->size(); ++k) {
        const ir::Dim& d = (*type->shape)[k];
        if (d.known()) shape->add_dim()->set_dim_value(d.value);
        else shape->add_dim()->set_dim_param(input->name() + ":" + std::to_string(k));
      }
    }
    Branch branch;
    ir::Graph imported = onnx_import::import_bytes(model.SerializeAsString(), graph->name(), "");
    branch.inputs = imported.inputs;
    branch.outputs = imported.outputs;
    // import_bytes lists a graph input once however often it is named; the order is the model's.
    if (branch.inputs.size() != static_cast<size_t>(graph->input_size()))
      throw init.node.error(ErrorKind::kInvalidModel, attr + " names an input twice");
    branch.engine = std::make_unique<CpuEngine>(std::move(imported));
    if (declared_.empty())
      for (const ir::TensorType* t : init.output_types) declared_.push_back(t ? t->dtype : DType::kUndefined);
    return branch;
  }

  const ir::Node& node_;
  Branch branches_[2];
  std::vector<DType> declared_;
};

}  // namespace

KILN_REGISTER_CPU_KERNELS(control_flow) {
  KernelEntry e;
  e.op = "If";
  e.dtypes = "all";
  e.makes_outputs = true;
  e.create = [](const KernelInit& init) { return std::make_unique<IfKernel>(init); };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
