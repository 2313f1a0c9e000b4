// CPU kernels of If and Loop (kiln's form: src/ops/control_flow.cc). Each subgraph, a
// self-contained ONNX model, is imported and built into a CPU engine of its own when the kernel
// is made, its inputs typed from the node's inputs here; a run runs it on the node's inputs and
// hands on its outputs, whose shapes only that run decides (KernelEntry::makes_outputs).
#include <cstring>
#include <limits>
#include <memory>

#include "cpu/engine.h"
#include "cpu/kernel.h"
#include "onnx/importer.h"

namespace kiln::cpu {

namespace {

// A Loop stops with an error after this many iterations: a model's loop without a trip count
// whose condition never turns false would otherwise run forever.
constexpr int64_t kMaxLoopIterations = 10'000'000;

struct Subgraph {
  std::unique_ptr<CpuEngine> engine;
  std::vector<std::string> inputs, outputs;

  std::map<std::string, Tensor> run(const std::vector<Tensor>& feed) const {
    std::map<std::string, Tensor> named;
    for (size_t i = 0; i < inputs.size(); ++i) named[inputs[i]] = feed[i];
    return engine->run(named);
  }
};

// The type of a node input as a subgraph input; with `any_shape` (a Loop's carried value) every
// dim is left to the run.
ir::TensorType input_type(const ir::Node& node, const KernelInit& init, size_t i, bool any_shape) {
  const ir::TensorType* type = init.input_types[i];
  if (!type || !type->shape)
    throw node.error(ErrorKind::kUnsupported, "the rank of input '" + node.inputs[i] + "' is not known when building");
  ir::TensorType t = *type;
  if (any_shape) t.shape = ir::Dims(t.shape->size(), ir::Dim::unknown());
  return t;
}

Subgraph build_subgraph(const KernelInit& init, const std::string& attr, const std::vector<ir::TensorType>& types) {
  const ir::Node& node = init.node;
  Subgraph sub;
  try {
    ir::Graph imported = onnx_import::import_subgraph(node.attrs.get_string(attr, ""), types, attr);
    sub.inputs = imported.inputs;
    sub.outputs = imported.outputs;
    sub.engine = std::make_unique<CpuEngine>(std::move(imported), 0, init.poison_outputs);
  } catch (Error& e) {
    if (e.node_name().empty()) e.node(node.name, node.op);
    throw;
  }
  return sub;
}

void check_dtype(const ir::Node& node, const std::vector<ir::TensorType>& declared, size_t o, const Tensor& t) {
  if (declared[o].dtype != DType::kUndefined && t.dtype() != declared[o].dtype)
    throw node.error(ErrorKind::kInvalidModel, "its subgraph's output " + std::to_string(o) + " is " + to_string(t.dtype()) +
                                                   ", not the declared " + to_string(declared[o].dtype));
}

std::vector<ir::TensorType> declared_outputs(const KernelInit& init) {
  std::vector<ir::TensorType> declared;
  for (const ir::TensorType* t : init.output_types) declared.push_back(t ? *t : ir::TensorType{});
  return declared;
}

class IfKernel : public Kernel {
 public:
  explicit IfKernel(const KernelInit& init) : node_(init.node), declared_(declared_outputs(init)) {
    std::vector<ir::TensorType> types;
    for (size_t i = 1; i < init.input_types.size(); ++i) types.push_back(input_type(node_, init, i, false));
    branches_[1] = build_subgraph(init, "then_model", types);
    branches_[0] = build_subgraph(init, "else_model", types);
    for (const Subgraph* b : {&branches_[0], &branches_[1]})
      if (b->outputs.size() != declared_.size())
        throw node_.error(ErrorKind::kInvalidModel, "a branch gives " + std::to_string(b->outputs.size()) + " outputs; the node has " +
                                                        std::to_string(declared_.size()));
  }

  void run(const std::vector<const Tensor*>& inputs, std::vector<Tensor>& outputs) override {
    const Tensor& cond = *inputs[0];
    if (cond.numel() != 1)
      throw node_.error(ErrorKind::kInvalidArgument, "the condition holds " + std::to_string(cond.numel()) + " values, not one");
    const Subgraph& branch = branches_[cond.value_as_double(0) != 0 ? 1 : 0];
    std::vector<Tensor> feed;
    for (size_t i = 1; i < inputs.size(); ++i) feed.push_back(*inputs[i]);
    std::map<std::string, Tensor> result = branch.run(feed);
    for (size_t o = 0; o < outputs.size(); ++o) {
      outputs[o] = std::move(result.at(branch.outputs[o]));
      check_dtype(node_, declared_, o, outputs[o]);
    }
  }

 private:
  const ir::Node& node_;
  std::vector<ir::TensorType> declared_;
  Subgraph branches_[2];
};

// Loop: inputs M, cond (either omitted), `carried` values, then what the body reads; the body
// takes (iteration, cond, carried..., reads...) and gives (cond, carried..., scans...).
class LoopKernel : public Kernel {
 public:
  explicit LoopKernel(const KernelInit& init) : node_(init.node), declared_(declared_outputs(init)) {
    const int64_t carried = node_.attrs.get_int("carried", -1);
    if (carried < 0 || static_cast<size_t>(carried) > declared_.size() || static_cast<size_t>(carried) + 2 > init.input_types.size())
      throw node_.error(ErrorKind::kInvalidModel, "its attribute carried must count the carried values among its inputs and outputs");
    carried_ = static_cast<size_t>(carried);
    // The carried values may change shape from one iteration to the next: any dims.
    std::vector<ir::TensorType> types = {ir::TensorType{DType::kInt64, ir::Dims{}}, ir::TensorType{DType::kBool, ir::Dims{}}};
    for (size_t i = 2; i < init.input_types.size(); ++i) types.push_back(input_type(node_, init, i, i < 2 + carried_));
    body_ = build_subgraph(init, "body_model", types);
    if (body_.outputs.size() != 1 + declared_.size())
      throw node_.error(ErrorKind::kInvalidModel, "its body gives " + std::to_string(body_.outputs.size()) + " outputs; it needs " +
                                                      std::to_string(1 + declared_.size()) + " (the condition and one per node output)");
  }

  void run(const std::vector<const Tensor*>& inputs, std::vector<Tensor>& outputs) override {
    const int64_t trips = inputs[0] ? inputs[0]->value_as_int(0) : std::numeric_limits<int64_t>::max();
    // The body's condition ends the loop with or without a cond input, as ONNX Runtime and
    // onnx's reference implementation run it.
    bool cond = inputs[1] ? inputs[1]->value_as_double(0) != 0 : true;
    std::vector<Tensor> feed(inputs.size());
    for (size_t i = 2; i < inputs.size(); ++i) feed[i] = *inputs[i];
    const size_t scan_count = declared_.size() - carried_;
    std::vector<std::vector<Tensor>> scans(scan_count);
    size_t scan_bytes = 0;
    for (int64_t i = 0; i < trips && cond; ++i) {
      if (i == kMaxLoopIterations)
        throw node_.error(ErrorKind::kUnsupported, "ran " + std::to_string(kMaxLoopIterations) + " iterations without stopping");
      feed[0] = Tensor::scalar<int64_t>(i);
      feed[1] = Tensor::scalar<bool>(cond);
      std::map<std::string, Tensor> result = body_.run(feed);
      cond = result.at(body_.outputs[0]).value_as_double(0) != 0;
      for (size_t k = 0; k < carried_; ++k) feed[2 + k] = std::move(result.at(body_.outputs[1 + k]));
      for (size_t k = 0; k < scan_count; ++k) {
        scans[k].push_back(std::move(result.at(body_.outputs[1 + carried_ + k])));
        scan_bytes += scans[k].back().nbytes();
      }
      // The iterations' scan values are held until the end: refused past the machine's memory,
      // not attempted.
      if (scan_bytes > physical_memory_bytes())
        throw node_.error(ErrorKind::kUnsupported, "its scan outputs pass the machine's memory after " + std::to_string(i + 1) +
                                                       " iterations");
    }
    for (size_t k = 0; k < carried_; ++k) {
      outputs[k] = feed[2 + k];
      check_dtype(node_, declared_, k, outputs[k]);
    }
    for (size_t k = 0; k < scan_count; ++k) outputs[carried_ + k] = stack(scans[k], carried_ + k);
  }

 private:
  // A scan output: the iterations' values stacked along a new first axis.
  Tensor stack(const std::vector<Tensor>& values, size_t o) const {
    if (values.empty()) {
      // No iteration ran: [0] and the dims the body declares (0 where it does not say).
      std::vector<int64_t> shape = {0};
      if (const auto& declared = declared_[o].shape)
        for (size_t d = 1; d < declared->size(); ++d) shape.push_back((*declared)[d].known() ? (*declared)[d].value : 0);
      return Tensor(declared_[o].dtype, shape);
    }
    const Tensor& first = values.front();
    check_dtype(node_, declared_, o, first);
    std::vector<int64_t> shape = {static_cast<int64_t>(values.size())};
    shape.insert(shape.end(), first.shape().begin(), first.shape().end());
    Tensor out(first.dtype(), shape);  // checks the size against the largest tensor
    auto* dst = static_cast<unsigned char*>(out.raw());
    for (const Tensor& v : values) {
      if (v.shape() != first.shape() || v.dtype() != first.dtype())
        throw node_.error(ErrorKind::kInvalidModel, "scan output " + std::to_string(o) + " changes shape between iterations (" +
                                                        shape_to_string(first.shape()) + ", then " + shape_to_string(v.shape()) + ")");
      std::memcpy(dst, v.raw(), v.nbytes());
      dst += v.nbytes();
    }
    return out;
  }

  const ir::Node& node_;
  std::vector<ir::TensorType> declared_;
  Subgraph body_;
  size_t carried_ = 0;
};

}  // namespace

KILN_REGISTER_CPU_KERNELS(control_flow) {
  {
    KernelEntry e;
    e.op = "If";
    e.dtypes = "all";
    e.makes_outputs = true;
    e.create = [](const KernelInit& init) { return std::make_unique<IfKernel>(init); };
    registry.add(std::move(e));
  }
  {
    KernelEntry e;
    e.op = "Loop";
    e.dtypes = "all";
    e.makes_outputs = true;
    e.create = [](const KernelInit& init) { return std::make_unique<LoopKernel>(init); };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
