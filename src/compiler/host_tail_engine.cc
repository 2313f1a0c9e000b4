#include "compiler/host_tail_engine.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "compiler/pipeline.h"

namespace kiln::compiler {

namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// What the two engines share: the split, and how the tail's layers read in Engine::info().
struct Parts {
  std::shared_ptr<const ir::Graph> whole;
  DataDependentSplit split;
  std::unique_ptr<backend::Engine> head, tail;
  std::map<std::string, std::string> tail_on_gpu;  // node name -> tactic

  std::string starts() const { return named_nodes(split.starts); }

  bool computed_by_tail(const std::string& output) const { return contains(split.tail.outputs, output); }

  std::vector<LayerInfo> tail_layers() const {
    std::vector<LayerInfo> layers;
    for (const ir::Node& n : split.tail.nodes) {
      const ir::Value* out = n.outputs.empty() ? nullptr : split.tail.find_value(n.outputs[0]);
      LayerInfo l;
      l.name = n.name;
      l.op = n.op;
      auto on_gpu = tail_on_gpu.find(n.name);
      l.tactic = on_gpu != tail_on_gpu.end() ? on_gpu->second : "cpu (after data-dependent shapes)";
      l.precision = out ? to_string(out->type.dtype) : "";
      l.cpu_fallback = on_gpu == tail_on_gpu.end();
      if (out && out->type.shape)
        for (const ir::Dim& d : *out->type.shape) l.shape.push_back(d.known() ? d.value : -1);
      layers.push_back(std::move(l));
    }
    return layers;
  }

  // Refuses what needs an output's shape before the run: a tail output's comes from the run.
  void check_planned(const std::string& name, const char* what) const {
    if (computed_by_tail(name))
      throw Error(ErrorKind::kUnsupported, std::string(what) + ": output '" + name +
                                               "' has the shape its data gives it, known only after a run (it follows " +
                                               starts() + ", which runs on the CPU engine after the GPU's part)")
          .hint("run the engine with Context::run or Engine::run, which return such outputs");
  }

  // The graph's inputs that the head reads, and refusal of names the model does not have.
  std::map<std::string, Tensor> head_inputs(const std::map<std::string, Tensor>& inputs) const {
    std::map<std::string, Tensor> out;
    for (const auto& [name, t] : inputs) {
      if (!contains(whole->inputs, name)) {
        std::string names;
        for (const std::string& n : whole->inputs) names += (names.empty() ? "" : ", ") + n;
        throw Error(ErrorKind::kInvalidArgument, "the model has no input named '" + name + "'").hint("its inputs are: " + names);
      }
      if (contains(split.head.inputs, name)) out.emplace(name, t);
    }
    return out;
  }

  // Runs the tail on what the head computed and the inputs it reads itself; the graph's outputs.
  std::map<std::string, Tensor> finish(std::map<std::string, Tensor> computed, const std::map<std::string, Tensor>& inputs) const {
    std::map<std::string, Tensor> tail_in;
    for (const std::string& name : split.tail.inputs) {
      auto it = computed.find(name);
      if (it != computed.end()) {
        tail_in.emplace(name, it->second);
        continue;
      }
      auto given = inputs.find(name);
      if (given == inputs.end()) throw Error(ErrorKind::kInvalidArgument, "input '" + name + "' was not given");
      tail_in.emplace(name, given->second);
    }
    std::map<std::string, Tensor> tail_out = tail->run(tail_in);
    std::map<std::string, Tensor> outputs;
    for (const std::string& name : whole->outputs)
      outputs[name] = computed_by_tail(name) ? tail_out.at(name) : computed.at(name);
    return outputs;
  }
};

// `pieces` one after another along the first dimension, then `zero_rows` rows of zeros.
Tensor joined(const std::string& name, const std::vector<Tensor>& pieces, int64_t zero_rows) {
  if (pieces.empty()) throw Error(ErrorKind::kInvalidArgument, "input '" + name + "' was given no pieces");
  std::vector<int64_t> shape = pieces.front().shape();
  if (shape.empty()) throw Error(ErrorKind::kInvalidArgument, "input '" + name + "' has no first dimension to join pieces along");
  shape[0] = zero_rows;
  for (const Tensor& p : pieces) {
    std::vector<int64_t> rest = p.shape();
    if (p.dtype() != pieces.front().dtype() || rest.size() != shape.size() ||
        !std::equal(rest.begin() + 1, rest.end(), shape.begin() + 1))
      throw Error(ErrorKind::kInvalidArgument, "the pieces of input '" + name + "' differ in dtype or in a dimension after the first");
    shape[0] += p.dim(0);
  }
  Tensor out(pieces.front().dtype(), shape);  // zero-filled: the padding rows
  unsigned char* at = static_cast<unsigned char*>(out.raw());
  for (const Tensor& p : pieces) {
    if (p.nbytes()) std::memcpy(at, p.raw(), p.nbytes());
    at += p.nbytes();
  }
  return out;
}

class HostTailContext final : public backend::Context {
 public:
  HostTailContext(std::shared_ptr<const Parts> parts, std::unique_ptr<backend::Context> head)
      : parts_(std::move(parts)), head_(std::move(head)) {}

  void set_optimization_profile(int index) override { head_->set_optimization_profile(index); }
  int optimization_profile() const override { return head_->optimization_profile(); }
  void set_input_shape(const std::string& name, const std::vector<int64_t>& shape) override {
    head_input(name, "set_input_shape");
    head_->set_input_shape(name, shape);
  }
  std::vector<int64_t> input_shape(const std::string& name) const override {
    head_input(name, "input_shape");
    return head_->input_shape(name);
  }
  void set_input_values(const std::string& name, const Tensor& values) override { head_->set_input_values(name, values); }
  std::vector<int64_t> output_shape(const std::string& name) override {
    graph_output(name, "output_shape");
    return head_->output_shape(name);
  }
  std::vector<LayerInfo> layers() override {
    std::vector<LayerInfo> layers = head_->layers(), tail = parts_->tail_layers();
    layers.insert(layers.end(), tail.begin(), tail.end());
    return layers;
  }
  void* input_buffer(const std::string& name) const override {
    head_input(name, "input_buffer");
    return head_->input_buffer(name);
  }
  void* output_buffer(const std::string& name) const override {
    graph_output(name, "output_buffer");
    return head_->output_buffer(name);
  }
  void set_tensor_address(const std::string& name, void* address, size_t bytes) override {
    if (contains(parts_->whole->outputs, name)) graph_output(name, "set_tensor_address");
    else head_input(name, "set_tensor_address");
    head_->set_tensor_address(name, address, bytes);
  }
  void* tensor_address(const std::string& name) const override {
    if (contains(parts_->whole->outputs, name)) graph_output(name, "tensor_address");
    else head_input(name, "tensor_address");
    return head_->tensor_address(name);
  }
  void enqueue(void*) override {
    throw Error(ErrorKind::kUnsupported, "enqueue() runs only the GPU's part of this engine: its last " +
                                             std::to_string(parts_->split.tail.nodes.size()) + " node(s) follow " +
                                             parts_->starts() + ", whose output shapes depend on the data, and run on the CPU engine")
        .hint("run it with Context::run, which runs both parts and returns every output");
  }
  void wait_for_last_run(void* stream) override { head_->wait_for_last_run(stream); }
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) override {
    return parts_->finish(head_->run(parts_->head_inputs(inputs)), inputs);
  }
  std::map<std::string, Tensor> run_concatenated(const std::map<std::string, std::vector<Tensor>>& pieces,
                                                 int64_t zero_rows) override {
    std::map<std::string, std::vector<Tensor>> head_pieces;
    std::map<std::string, Tensor> tail_inputs;
    for (const auto& [name, list] : pieces) {
      if (contains(parts_->split.head.inputs, name)) head_pieces.emplace(name, list);
      if (contains(parts_->split.tail.inputs, name)) tail_inputs.emplace(name, joined(name, list, zero_rows));
    }
    return parts_->finish(head_->run_concatenated(head_pieces, zero_rows), tail_inputs);
  }
  // The GPU's layers: the CPU engine's part runs only in run().
  std::vector<LayerTiming> profile(void* stream) override { return head_->profile(stream); }

 private:
  void head_input(const std::string& name, const char* what) const {
    if (contains(parts_->whole->inputs, name) && !contains(parts_->split.head.inputs, name))
      throw Error(ErrorKind::kUnsupported, std::string(what) + ": input '" + name +
                                               "' is read only by the nodes after " + parts_->starts() +
                                               ", which run on the CPU engine; run() takes it")
          .hint("run the engine with Context::run");
    if (!contains(parts_->whole->inputs, name))
      throw Error(ErrorKind::kInvalidArgument, "the engine has no input named '" + name + "'");
  }
  void graph_output(const std::string& name, const char* what) const {
    parts_->check_planned(name, what);
    if (!contains(parts_->whole->outputs, name))
      throw Error(ErrorKind::kInvalidArgument, "the engine has no output named '" + name + "'");
  }

  std::shared_ptr<const Parts> parts_;  // a context may outlive the kiln::Engine it came from
  std::unique_ptr<backend::Context> head_;
};

class HostTailEngine final : public backend::Engine {
 public:
  explicit HostTailEngine(std::shared_ptr<Parts> parts) : parts_(std::move(parts)) {}

  const ir::Graph& graph() const override { return *parts_->whole; }
  size_t layer_count() const override { return parts_->head->layer_count() + parts_->tail->layer_count(); }
  void describe(EngineInfo& info) const override {
    parts_->head->describe(info);
    std::vector<LayerInfo> tail = parts_->tail_layers();
    info.layers.insert(info.layers.end(), tail.begin(), tail.end());
    for (ProfileInfo& p : info.profiles) {
      p.layers.insert(p.layers.end(), tail.begin(), tail.end());
      for (const LayerInfo& l : tail) {
        p.min_shapes.push_back(l.shape);
        p.max_shapes.push_back(l.shape);
      }
    }
    info.has_cpu_fallback = true;
    info.data_dependent_nodes = parts_->split.starts;
  }
  // The head fixes the dimensions of the outputs it computes; the tail's keep the model's.
  std::vector<TensorDesc> outputs(std::vector<TensorDesc> declared) const override {
    std::vector<TensorDesc> head_declared;
    for (const std::string& name : parts_->split.head.outputs) {
      auto it = std::find_if(declared.begin(), declared.end(), [&](const TensorDesc& d) { return d.name == name; });
      head_declared.push_back(it != declared.end() ? *it : compiler::describe(parts_->split.head, name));
    }
    head_declared = parts_->head->outputs(std::move(head_declared));
    for (TensorDesc& d : declared)
      for (const TensorDesc& h : head_declared)
        if (h.name == d.name) d = h;
    return declared;
  }
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) const override {
    return parts_->finish(parts_->head->run(parts_->head_inputs(inputs)), inputs);
  }
  std::unique_ptr<backend::Context> create_context(const ContextOptions& options) const override {
    return std::make_unique<HostTailContext>(parts_, parts_->head->create_context(options));
  }
  std::map<std::string, std::string> tactics() const override {
    std::map<std::string, std::string> all = parts_->head->tactics(), tail = parts_->tail->tactics();
    all.insert(tail.begin(), tail.end());
    return all;
  }
  // The where-faster build compares engines of one model: their tails are the same work (the CPU
  // engine's, and row stages in fp16 whatever the precision).
  std::unique_ptr<backend::Timer> timer() const override { return parts_->head->timer(); }
  std::vector<LayerTiming> profile(const std::map<std::string, Tensor>& inputs) const override {
    return parts_->head->profile(inputs);
  }

 private:
  std::shared_ptr<Parts> parts_;
};

}  // namespace

std::unique_ptr<backend::Engine> make_host_tail_engine(std::shared_ptr<const ir::Graph> whole, DataDependentSplit split,
                                                       std::unique_ptr<backend::Engine> head,
                                                       std::unique_ptr<backend::Engine> tail,
                                                       std::map<std::string, std::string> tail_on_gpu) {
  auto parts = std::make_shared<Parts>();
  parts->tail_on_gpu = std::move(tail_on_gpu);
  parts->whole = std::move(whole);
  parts->split = std::move(split);
  parts->head = std::move(head);
  parts->tail = std::move(tail);
  return std::make_unique<HostTailEngine>(std::move(parts));
}

}  // namespace kiln::compiler
