// CPU kernels of If, Loop and Scan (kiln's form: src/ops/control_flow.cc). Each subgraph, a
// self-contained ONNX model, is imported, simplified (simplify_subgraph, control_flow.h) and
// built into a CPU engine of its own when the kernel is made, its inputs typed from the node's
// inputs here; a run runs it on the node's inputs and hands on its outputs, whose shapes only
// that run decides (KernelEntry::makes_outputs).
#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <new>

#include "cpu/control_flow.h"

#include "cpu/engine.h"
#include "cpu/evaluate.h"
#include "cpu/kernel.h"
#include "ir/op_schema.h"
#include "onnx/importer.h"
#include "ops/control_flow.h"
#include "passes/passes.h"

namespace kiln::cpu {

int simplify_subgraph(ir::Graph& graph) {
  const passes::NodeEvaluator evaluate = [](const ir::Node& node, const std::vector<const Tensor*>& inputs) {
    return evaluate_node(node, inputs);
  };
  int total = 0;
  for (int round = 0; round < 16; ++round) {
    int changes = passes::remove_identity_and_dropout(graph);
    changes += passes::fold_constants(graph, evaluate);
    changes += passes::inline_constant_if(graph);
    changes += passes::simplify_shape_chains(graph);
    changes += passes::eliminate_dead_code(graph);
    ir::infer_shapes(graph);
    total += changes;
    if (changes == 0) break;
  }
  return total;
}

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

// The types of the node's inputs as its subgraph takes them (ops/control_flow.h).
std::vector<ir::TensorType> subgraph_inputs(const KernelInit& init) {
  std::vector<ir::TensorType> types;
  const std::string why = ir::subgraph_input_types(init.node, init.input_types, types);
  if (!why.empty()) throw init.node.error(ErrorKind::kUnsupported, why + " when building");
  return types;
}

// `rewrite` may change the imported graph before it is built (the Loop's appended values).
Subgraph build_subgraph(const KernelInit& init, const std::string& attr, const std::vector<ir::TensorType>& types,
                        const std::function<void(ir::Graph&)>& rewrite = {}) {
  const ir::Node& node = init.node;
  Subgraph sub;
  try {
    ir::Graph imported = onnx_import::import_subgraph(node.attrs.get_string(attr, ""), types, attr);
    simplify_subgraph(imported);
    if (rewrite) rewrite(imported);
    sub.inputs = imported.inputs;
    sub.outputs = imported.outputs;
    sub.engine = std::make_unique<CpuEngine>(std::move(imported), 0, init.poison_outputs, init.bfloat16_products);
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

// An output the node gives as its subgraph computed it (If's, a Loop's carried values, a Scan's
// states): its dtype and, where declared, its rank, which the nodes after it were planned for.
void check_type(const ir::Node& node, const std::vector<ir::TensorType>& declared, size_t o, const Tensor& t) {
  check_dtype(node, declared, o, t);
  if (declared[o].shape && static_cast<size_t>(t.rank()) != declared[o].shape->size())
    throw node.error(ErrorKind::kInvalidModel, "its subgraph's output " + std::to_string(o) + " has rank " + std::to_string(t.rank()) +
                                                   ", not the declared " + std::to_string(declared[o].shape->size()));
}

std::vector<ir::TensorType> declared_outputs(const KernelInit& init) {
  std::vector<ir::TensorType> declared;
  for (const ir::TensorType* t : init.output_types) declared.push_back(t ? *t : ir::TensorType{});
  return declared;
}

class IfKernel : public Kernel {
 public:
  explicit IfKernel(const KernelInit& init) : node_(init.node), declared_(declared_outputs(init)) {
    const std::vector<ir::TensorType> types = subgraph_inputs(init);
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
      check_type(node_, declared_, o, outputs[o]);
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
    appended_.assign(carried_, false);
    body_ = build_subgraph(init, "body_model", subgraph_inputs(init), [this](ir::Graph& body) { find_appends(body); });
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
    std::vector<Appended> grown(carried_);
    for (size_t k = 0; k < carried_; ++k)
      if (appended_[k]) grown[k].start(node_, k, feed[2 + k]);
    for (int64_t i = 0; i < trips && cond; ++i) {
      if (i == kMaxLoopIterations)
        throw node_.error(ErrorKind::kUnsupported, "ran " + std::to_string(kMaxLoopIterations) + " iterations without stopping");
      feed[0] = Tensor::scalar<int64_t>(i);
      feed[1] = Tensor::scalar<bool>(cond);
      std::map<std::string, Tensor> result = body_.run(feed);
      cond = result.at(body_.outputs[0]).value_as_double(0) != 0;
      // Appended pieces first: a piece may also be another output of the body, moved out below.
      // (With a trip count, the iterations after this one bound the pieces still to come.)
      for (size_t k = 0; k < carried_; ++k)
        if (appended_[k]) grown[k].append(node_, k, result.at(body_.outputs[1 + k]), inputs[0] ? trips - i - 1 : 0);
      for (size_t k = 0; k < carried_; ++k)
        if (!appended_[k]) feed[2 + k] = std::move(result.at(body_.outputs[1 + k]));
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
      outputs[k] = appended_[k] ? grown[k].take() : feed[2 + k];
      check_type(node_, declared_, k, outputs[k]);
    }
    for (size_t k = 0; k < scan_count; ++k) outputs[carried_ + k] = stack(scans[k], carried_ + k);
  }

 private:
  // A carried value that each iteration extends along its first axis: rows appended to a buffer
  // that grows by doubling, where running the body's Concat copied the whole value every
  // iteration (torchvision's Mask R-CNN pastes its masks so: 100 masks of 800 x 800 copied
  // 13 GB, 2.9 s of a 47 ms model). With a trip count, the first piece reserves room for as many
  // pieces of its size as iterations are left (pieces of one size: one allocation, no copy
  // while growing), and the value is the buffer itself unless more than half of it is unused.
  struct Appended {
    DType dtype = DType::kUndefined;
    std::vector<int64_t> row_shape;  // the dims after the first
    int64_t rows = 0;
    Tensor buffer;  // uint8 bytes, `used` of them filled
    size_t used = 0;

    size_t capacity() const { return static_cast<size_t>(buffer.nbytes()); }

    void start(const ir::Node& node, size_t k, const Tensor& initial) {
      if (initial.rank() == 0)
        throw node.error(ErrorKind::kInvalidArgument, "carried value " + std::to_string(k) +
                                                          " is a scalar, which its body's Concat cannot extend");
      dtype = initial.dtype();
      row_shape.assign(initial.shape().begin() + 1, initial.shape().end());
      rows = 0;
      buffer = Tensor();
      used = 0;
      append(node, k, initial, 0);
    }
    // `pieces_after`: how many pieces may still come (0: unknown).
    void append(const ir::Node& node, size_t k, const Tensor& piece, int64_t pieces_after) {
      if (piece.dtype() != dtype || piece.rank() != static_cast<int>(row_shape.size()) + 1 ||
          !std::equal(row_shape.begin(), row_shape.end(), piece.shape().begin() + 1))
        throw node.error(ErrorKind::kInvalidArgument,
                         "carried value " + std::to_string(k) + " is extended along its first axis by a piece of " +
                             shape_to_string(piece.shape()) + " " + to_string(piece.dtype()) + ", which does not fit its " +
                             shape_to_string(shape()) + " " + to_string(dtype));
      const size_t bytes = static_cast<size_t>(piece.nbytes());
      // Refused past the machine's memory, as the scan outputs are, not attempted.
      const size_t memory = physical_memory_bytes();
      if (used + bytes > memory)
        throw node.error(ErrorKind::kUnsupported, "carried value " + std::to_string(k) + " grows past the machine's memory (" +
                                                      std::to_string(used + bytes) + " bytes)");
      if (used + bytes > capacity()) {
        size_t want = std::max(used + bytes, 2 * capacity());
        // The pieces still to come, if they are of this one's size, while that is at most a
        // quarter of the machine's memory (a condition may end the loop long before its trip
        // count; past that the buffer doubles).
        if (pieces_after > 0 && bytes > 0 &&
            static_cast<size_t>(pieces_after) <= (memory / 4 - std::min(memory / 4, used + bytes)) / bytes)
          want = std::max(want, used + bytes * (static_cast<size_t>(pieces_after) + 1));
        want = std::min(want, memory);
        Tensor grown;
        try {
          grown = Tensor::uninitialized(DType::kUInt8, {static_cast<int64_t>(want)});
        } catch (const std::bad_alloc&) {
          throw node.error(ErrorKind::kUnsupported, "carried value " + std::to_string(k) + " cannot grow to " +
                                                        std::to_string(want) + " bytes: out of memory");
        }
        if (used) std::memcpy(grown.raw(), buffer.raw(), used);
        buffer = std::move(grown);
      }
      if (bytes) std::memcpy(static_cast<unsigned char*>(buffer.raw()) + used, piece.raw(), bytes);
      used += bytes;
      rows += piece.dim(0);
    }
    std::vector<int64_t> shape() const {
      std::vector<int64_t> s = {rows};
      s.insert(s.end(), row_shape.begin(), row_shape.end());
      return s;
    }
    Tensor take() {
      Tensor out;
      if (used == 0 || used < capacity() / 2) {
        out = Tensor::uninitialized(dtype, shape());  // checks the size against the largest tensor
        if (used) std::memcpy(out.raw(), buffer.raw(), used);
      } else {
        out = Tensor::over_storage(dtype, shape(), buffer.storage());
      }
      buffer = Tensor();
      used = 0;
      return out;
    }
  };

  // Carried values that the body only extends: its output k is Concat(axis 0) of its carried input
  // k, read by nothing else, and a piece. The body then gives the piece, and run() appends it.
  void find_appends(ir::Graph& body) {
    for (size_t k = 0; k < carried_; ++k) {
      if (2 + k >= body.inputs.size() || 1 + k >= body.outputs.size()) break;
      const std::string& in = body.inputs[2 + k];
      const std::string& out = body.outputs[1 + k];
      const int producer = body.producer(out);
      if (producer < 0) continue;
      const ir::Node& concat = body.nodes[static_cast<size_t>(producer)];
      if (concat.op != "Concat" || !concat.domain.empty() || concat.attrs.get_int("axis", -1) != 0 ||
          concat.inputs.size() != 2 || concat.inputs[0] != in || concat.inputs[1] == in || concat.inputs[1].empty())
        continue;
      auto reads = [&](const std::string& value) {
        size_t count = static_cast<size_t>(std::count(body.outputs.begin(), body.outputs.end(), value));
        for (const ir::Node& n : body.nodes) count += static_cast<size_t>(std::count(n.inputs.begin(), n.inputs.end(), value));
        return count;
      };
      if (reads(in) != 1 || reads(out) != 1) continue;
      body.outputs[1 + k] = concat.inputs[1];
      body.nodes.erase(body.nodes.begin() + producer);
      appended_[k] = true;
    }
    body.prune_values();
  }

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
  std::vector<bool> appended_;  // per carried value: extended by run(), not by the body
};

// Scan: the body runs once per slice of the scanned inputs (along each one's axis, forward or
// reversed), the states carried from one run to the next; each scan output stacks the runs'
// elements along its axis (reversed where its direction says).
class ScanKernel : public Kernel {
 public:
  explicit ScanKernel(const KernelInit& init) : node_(init.node), declared_(declared_outputs(init)) {
    states_ = static_cast<size_t>(node_.attrs.get_int("states", 0));
    scanned_ = static_cast<size_t>(node_.attrs.get_int("num_scan_inputs", 0));
    input_axes_ = node_.attrs.get_ints("scan_input_axes", std::vector<int64_t>(scanned_, 0));
    input_reverse_ = node_.attrs.get_ints("scan_input_directions", std::vector<int64_t>(scanned_, 0));
    const size_t outputs = declared_.size() - states_;
    output_axes_ = node_.attrs.get_ints("scan_output_axes", std::vector<int64_t>(outputs, 0));
    output_reverse_ = node_.attrs.get_ints("scan_output_directions", std::vector<int64_t>(outputs, 0));
    if (input_axes_.size() != scanned_ || input_reverse_.size() != scanned_ || output_axes_.size() != outputs ||
        output_reverse_.size() != outputs)
      throw node_.error(ErrorKind::kInvalidModel, "its scan axes and directions must give one value per scanned input and scan output");
    batched_ = node_.attrs.get_int("batched", 0) != 0;
    const std::vector<ir::TensorType> types = subgraph_inputs(init);  // checks the input axes
    for (size_t j = 0; j < scanned_; ++j)  // of what is scanned: one batch entry where batched
      if (input_axes_[j] < 0) input_axes_[j] += static_cast<int64_t>(types[states_ + j].shape->size()) + 1;
    body_ = build_subgraph(init, "body_model", types);
    if (body_.outputs.size() != declared_.size())
      throw node_.error(ErrorKind::kInvalidModel, "its body gives " + std::to_string(body_.outputs.size()) + " outputs; the node has " +
                                                      std::to_string(declared_.size()));
  }

  void run(const std::vector<const Tensor*>& inputs, std::vector<Tensor>& outputs) override {
    if (!batched_) return scan(inputs, outputs);
    // Opset 8: each batch entry of the states and scanned inputs scanned on its own, the outputs
    // stacked along a batch axis.
    const size_t per_entry = states_ + scanned_;
    int64_t batch = -1;
    for (size_t i = 0; i < per_entry; ++i) {
      if (inputs[i]->rank() < 1) throw node_.error(ErrorKind::kInvalidArgument, "input " + std::to_string(i) + " has no batch axis");
      if (batch >= 0 && inputs[i]->dim(0) != batch)
        throw node_.error(ErrorKind::kInvalidArgument, "its inputs have different batch sizes (" + std::to_string(batch) + ", " +
                                                           std::to_string(inputs[i]->dim(0)) + ")");
      batch = inputs[i]->dim(0);
    }
    if (batch == 0) throw node_.error(ErrorKind::kUnsupported, "its batch is empty (its outputs' shapes would be unknown)");
    std::vector<std::vector<Tensor>> entries(declared_.size());
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<Tensor> sliced(per_entry);
      std::vector<const Tensor*> entry(inputs.begin(), inputs.end());
      for (size_t i = 0; i < per_entry; ++i) {
        sliced[i] = slice(*inputs[i], 0, b);
        entry[i] = &sliced[i];
      }
      std::vector<Tensor> results(declared_.size());
      scan(entry, results, /*check_states=*/false);
      for (size_t o = 0; o < results.size(); ++o) entries[o].push_back(std::move(results[o]));
    }
    for (size_t o = 0; o < declared_.size(); ++o) {
      outputs[o] = stack(entries[o], o, 0, false);
      if (o < states_) check_type(node_, declared_, o, outputs[o]);
    }
  }

 private:
  void scan(const std::vector<const Tensor*>& inputs, std::vector<Tensor>& outputs, bool check_states = true) {
    std::vector<Tensor> feed(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) feed[i] = *inputs[i];
    int64_t length = -1;
    for (size_t j = 0; j < scanned_; ++j) {
      const int64_t n = inputs[states_ + j]->dim(static_cast<int>(input_axes_[j]));
      if (length >= 0 && n != length)
        throw node_.error(ErrorKind::kInvalidArgument, "its scanned inputs have different lengths (" + std::to_string(length) + ", " +
                                                           std::to_string(n) + ")");
      length = n;
    }
    if (length > kMaxLoopIterations) throw node_.error(ErrorKind::kUnsupported, "scans more than " + std::to_string(kMaxLoopIterations) + " slices");
    const size_t outputs_scanned = declared_.size() - states_;
    std::vector<std::vector<Tensor>> elements(outputs_scanned);
    for (int64_t t = 0; t < length; ++t) {
      for (size_t j = 0; j < scanned_; ++j)
        feed[states_ + j] = slice(*inputs[states_ + j], input_axes_[j], input_reverse_[j] ? length - 1 - t : t);
      std::map<std::string, Tensor> result = body_.run(feed);
      for (size_t k = 0; k < states_; ++k) feed[k] = std::move(result.at(body_.outputs[k]));
      for (size_t k = 0; k < outputs_scanned; ++k) elements[k].push_back(std::move(result.at(body_.outputs[states_ + k])));
    }
    for (size_t k = 0; k < states_; ++k) {
      outputs[k] = feed[k];
      if (check_states) check_type(node_, declared_, k, outputs[k]);
    }
    for (size_t k = 0; k < outputs_scanned; ++k) outputs[states_ + k] = stack(elements[k], states_ + k, output_axes_[k], output_reverse_[k] != 0);
  }

  // Slice `index` of x along `axis`, the axis removed.
  static Tensor slice(const Tensor& x, int64_t axis, int64_t index) {
    std::vector<int64_t> shape = x.shape();
    const int64_t n = shape[static_cast<size_t>(axis)];
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= shape[static_cast<size_t>(d)];
    for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
    shape.erase(shape.begin() + axis);
    Tensor out(x.dtype(), shape);
    const size_t row = static_cast<size_t>(inner) * element_size(x.dtype());
    const auto* src = static_cast<const unsigned char*>(x.raw());
    auto* dst = static_cast<unsigned char*>(out.raw());
    for (int64_t o = 0; o < outer; ++o) std::memcpy(dst + static_cast<size_t>(o) * row, src + static_cast<size_t>(o * n + index) * row, row);
    return out;
  }

  // The elements stacked along `axis` (of the stacked rank; negative counts from the end).
  Tensor stack(const std::vector<Tensor>& values, size_t o, int64_t axis, bool reverse) const {
    const std::vector<int64_t> element_shape = values.empty() ? std::vector<int64_t>{} : values.front().shape();
    const int64_t rank = static_cast<int64_t>(element_shape.size()) + 1;
    if (axis < -rank || axis >= rank) throw node_.error(ErrorKind::kInvalidModel, "a scan output axis is out of range");
    if (axis < 0) axis += rank;
    if (values.empty()) {
      std::vector<int64_t> shape(static_cast<size_t>(std::max<int64_t>(rank, 1)), 0);
      return Tensor(declared_[o].dtype, shape);
    }
    const Tensor& first = values.front();
    check_dtype(node_, declared_, o, first);
    const int64_t count = static_cast<int64_t>(values.size());
    std::vector<int64_t> shape = element_shape;
    shape.insert(shape.begin() + axis, count);
    Tensor out(first.dtype(), shape);
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= element_shape[static_cast<size_t>(d)];
    for (size_t d = static_cast<size_t>(axis); d < element_shape.size(); ++d) inner *= element_shape[d];
    const size_t row = static_cast<size_t>(inner) * element_size(first.dtype());
    auto* dst = static_cast<unsigned char*>(out.raw());
    for (int64_t t = 0; t < count; ++t) {
      const Tensor& v = values[static_cast<size_t>(t)];
      if (v.shape() != element_shape || v.dtype() != first.dtype())
        throw node_.error(ErrorKind::kInvalidModel, "scan output " + std::to_string(o) + " changes shape between iterations");
      const int64_t at = reverse ? count - 1 - t : t;
      const auto* src = static_cast<const unsigned char*>(v.raw());
      for (int64_t p = 0; p < outer; ++p) std::memcpy(dst + static_cast<size_t>(p * count + at) * row, src + static_cast<size_t>(p) * row, row);
    }
    return out;
  }

  const ir::Node& node_;
  std::vector<ir::TensorType> declared_;
  Subgraph body_;
  size_t states_ = 0, scanned_ = 0;
  bool batched_ = false;  // opset 8's form: a batch axis first, each entry scanned on its own
  std::vector<int64_t> input_axes_, input_reverse_, output_axes_, output_reverse_;
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
  {
    KernelEntry e;
    e.op = "Scan";
    e.dtypes = "all";
    e.makes_outputs = true;
    e.create = [](const KernelInit& init) { return std::make_unique<ScanKernel>(init); };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
