#include "cpu/engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <set>

#include "cpu/packed_weights.h"
#include "cpu/widened_kernel.h"
#include "ir/op_schema.h"
#include "ir/sizes.h"

namespace kiln::cpu {

namespace {
// The deleter of the pool's buffers; it also records their capacity (and marks them as the
// pool's: std::get_deleter finds it only on buffers made here).
struct PoolBuffer {
  static constexpr size_t kAlignment = 64;
  size_t capacity;
  std::shared_ptr<std::atomic<size_t>> held;  // the pool's count of live bytes
  void operator()(unsigned char* p) const {
    ::operator delete[](p, std::align_val_t(kAlignment));
    *held -= capacity;
  }
};
}  // namespace

size_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page_size) : SIZE_MAX;
}

BufferPool::BufferPool(size_t limit_bytes)
    : held_(std::make_shared<std::atomic<size_t>>(0)), limit_(limit_bytes ? limit_bytes : physical_memory_bytes()) {}

std::shared_ptr<unsigned char[]> BufferPool::take(size_t bytes) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = free_.lower_bound(bytes);
  if (it != free_.end() && it->first <= 2 * bytes + 4096) {
    std::shared_ptr<unsigned char[]> buffer = std::move(it->second);
    free_.erase(it);
    return buffer;
  }
  const size_t capacity = std::max<size_t>(PoolBuffer::kAlignment, (bytes + 63) / 64 * 64);
  if (capacity > limit_ || *held_ > limit_ - capacity) {
    free_.clear();  // free buffers count too: let them go before refusing
    if (capacity > limit_ || *held_ > limit_ - capacity)
      throw Error(ErrorKind::kInvalidArgument, "needs " + format_bytes(static_cast<double>(bytes)) + " more with " +
                                                   format_bytes(static_cast<double>(held_->load())) +
                                                   " already in use: that passes the memory limit of " +
                                                   format_bytes(static_cast<double>(limit_)))
          .hint("give the run more memory (--max-memory, BuildOptions::max_memory; the default is the machine's memory) "
                "or smaller inputs");
  }
  lock.unlock();
  auto* p = static_cast<unsigned char*>(::operator new[](capacity, std::align_val_t(PoolBuffer::kAlignment)));
  *held_ += capacity;
  return std::shared_ptr<unsigned char[]>(p, PoolBuffer{capacity, held_});
}

bool BufferPool::sole_holder(const Tensor& t) {
  const std::shared_ptr<unsigned char[]>& storage = t.storage();
  // use_count 1: nothing else holds it (a kernel that returned a view of its input would
  // share it; graph outputs are never given back). No PoolBuffer: not made here (a caller's input).
  return storage && storage.use_count() == 1 && std::get_deleter<PoolBuffer>(storage);
}

void BufferPool::give(Tensor& t) {
  if (!sole_holder(t)) return;
  const std::shared_ptr<unsigned char[]>& storage = t.storage();
  std::lock_guard<std::mutex> lock(mutex_);
  free_.emplace(std::get_deleter<PoolBuffer>(storage)->capacity, storage);
}

CpuEngine::CpuEngine(ir::Graph graph, size_t memory_limit, bool poison_outputs, bool bfloat16_products)
    : graph_(std::move(graph)), poison_outputs_(poison_outputs), bfloat16_products_(bfloat16_products), pool_(memory_limit) {
  auto slot_of = [&](const std::string& name) {
    auto it = slots_.find(name);
    if (it != slots_.end()) return it->second;
    slots_[name] = num_slots_;
    return num_slots_++;
  };
  for (const std::string& in : graph_.inputs) slot_of(in);
  const std::set<std::string> packable = packable_constants();
  take_packed_constants(packable);

  std::vector<std::string> problems;
  for (const ir::Node& node : graph_.nodes) {
    Step step;
    step.node = &node;
    KernelInit init{node, {}, {}, {}, poison_outputs_, bfloat16_products_, {}};
    for (const std::string& in : node.inputs) {
      const ir::Value* v = in.empty() ? nullptr : graph_.find_value(in);
      init.input_types.push_back(v ? &v->type : nullptr);
      init.constants.push_back(v && v->constant ? &*v->constant : nullptr);
      init.packed.push_back(v && v->packed ? v->packed.get() : nullptr);
      step.inputs.push_back(in.empty() ? -1 : slot_of(in));
    }
    for (const std::string& out : node.outputs) {
      const ir::Value* v = out.empty() ? nullptr : graph_.find_value(out);
      init.output_types.push_back(v ? &v->type : nullptr);
      step.outputs.push_back(out.empty() ? -1 : slot_of(out));
    }
    const KernelEntry* entry = KernelRegistry::instance().find(node.op, node.domain);
    std::string why;
    if (!entry) why = "the CPU engine has no kernel for " + node.op;
    else if (entry->check) why = entry->check(init);
    step.makes_outputs = entry && entry->makes_outputs;
    try {
      if (!why.empty() && entry) {
        // float16 / bfloat16 values the kernel does not take: its float32 form, if it runs the node.
        step.kernel = make_widened_kernel(*entry, init);
        if (step.kernel) why.clear();
      }
      if (!why.empty()) {
        problems.push_back("node '" + node.name + "' (" + node.op + "): " + why);
        continue;
      }
      if (!step.kernel) step.kernel = entry->create(init);
    } catch (Error& e) {
      if (e.node_name().empty()) e.node(node.name, node.op);
      throw;
    }
    steps_.push_back(std::move(step));
  }
  if (!problems.empty()) {
    std::string msg = std::to_string(problems.size()) + " node(s) cannot run on the CPU engine: ";
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    throw Error(ErrorKind::kUnsupported, msg);
  }

  keep_packed_constants(packable);

  // A graph output may be an initializer no node reads (e.g. an imported Constant).
  for (const std::string& o : graph_.outputs) slot_of(o);
  constant_slots_.resize(static_cast<size_t>(num_slots_));
  for (const auto& [name, slot] : slots_) {
    const ir::Value* v = graph_.find_value(name);
    if (v && v->constant) constant_slots_[static_cast<size_t>(slot)] = *v->constant;
  }
  // Free each intermediate after its last reader; graph inputs, outputs and constants stay.
  std::set<int> keep;
  for (const std::string& o : graph_.outputs) keep.insert(slots_.at(o));
  std::vector<int> last_reader(static_cast<size_t>(num_slots_), -1);
  for (size_t s = 0; s < steps_.size(); ++s)
    for (int in : steps_[s].inputs)
      if (in >= 0) last_reader[static_cast<size_t>(in)] = static_cast<int>(s);
  for (int slot = 0; slot < num_slots_; ++slot) {
    int r = last_reader[static_cast<size_t>(slot)];
    if (r >= 0 && !keep.count(slot) && !constant_slots_[static_cast<size_t>(slot)].defined())
      steps_[static_cast<size_t>(r)].release.push_back(slot);
  }
  std::set<int> input_slots;
  for (const std::string& in : graph_.inputs) input_slots.insert(slots_.at(in));
  for (Step& step : steps_) {
    const int in = step.kernel->overwritable_input();
    if (in < 0 || static_cast<size_t>(in) >= step.inputs.size() || step.inputs[static_cast<size_t>(in)] < 0) continue;
    const int slot = step.inputs[static_cast<size_t>(in)];
    if (std::count(step.inputs.begin(), step.inputs.end(), slot) == 1 &&
        std::find(step.release.begin(), step.release.end(), slot) != step.release.end()) {
      step.overwritable = in;
      step.reshapes = step.kernel->output_reshapes_input() && !input_slots.count(slot);
    }
  }
}

// The packs are handed only to a kernel that takes them and is the constant's one reader (an
// engine file's packs were made that way; a forged file's that were not become values again).
std::set<std::string> CpuEngine::packable_constants() const {
  struct Readers {
    int count = 0;
    const ir::Node* node = nullptr;
    size_t input = 0;
  };
  std::map<std::string, Readers> readers;
  for (const ir::Node& node : graph_.nodes)
    for (size_t i = 0; i < node.inputs.size(); ++i)
      if (const ir::Value* v = node.inputs[i].empty() ? nullptr : graph_.find_value(node.inputs[i]); v && v->constant) {
        Readers& r = readers[node.inputs[i]];
        if (r.count++ == 0) r.node = &node, r.input = i;
      }
  std::set<std::string> packable;
  for (const auto& [name, r] : readers) {
    if (r.count != 1 || graph_.is_graph_output(name)) continue;
    const KernelEntry* entry = KernelRegistry::instance().find(r.node->op, r.node->domain);
    if (entry && std::find(entry->packed_inputs.begin(), entry->packed_inputs.end(), r.input) != entry->packed_inputs.end())
      packable.insert(name);
  }
  return packable;
}

void CpuEngine::take_packed_constants(const std::set<std::string>& packable) {
  std::vector<std::string> names;
  for (const auto& [name, v] : graph_.values())
    if (v.packed) names.push_back(name);
  for (const std::string& name : names) {
    ir::Value& v = graph_.value(name);
    if (!v.constant)
      throw Error(ErrorKind::kInvalidModel, "packed value '" + name + "' is not a constant");
    check_packed_constant(name, *v.packed, v.constant->dtype(), v.constant->shape());
    if (!packable.count(name)) {
      v.constant = unpack_constant(*v.packed, v.constant->shape());
      v.packed.reset();
    }
  }
}

void CpuEngine::keep_packed_constants(const std::set<std::string>& packable) {
  for (size_t s = 0; s < steps_.size(); ++s) {
    const ir::Node& node = *steps_[s].node;
    std::vector<std::pair<size_t, ir::PackedConstant>> packs = steps_[s].kernel->packed_constants();
    // A pack the kernel was handed but does not hold (a path that reads the values at run): the
    // values again.
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      ir::Value* v = node.inputs[i].empty() ? nullptr : graph_.find_value(node.inputs[i]);
      if (v && v->packed && std::none_of(packs.begin(), packs.end(), [&](const auto& p) { return p.first == i; })) {
        v->constant = unpack_constant(*v->packed, v->constant->shape());
        v->packed.reset();
      }
    }
    for (auto& [input, pack] : packs) {
      if (input >= node.inputs.size()) continue;
      ir::Value* v = graph_.find_value(node.inputs[input]);
      if (!v || !v->constant || v->packed || !packable.count(v->name)) continue;
      // Values of another dtype or shape than the pack's would be read wrong from the file.
      check_packed_constant(v->name, pack, v->constant->dtype(), v->constant->shape());
      v->packed = std::make_shared<const ir::PackedConstant>(std::move(pack));
      v->constant = Tensor::over_storage(v->constant->dtype(), v->constant->shape(), nullptr);
    }
  }
}

void CpuEngine::check_inputs(const std::map<std::string, Tensor>& inputs) const {
  for (const auto& [name, t] : inputs)
    if (std::find(graph_.inputs.begin(), graph_.inputs.end(), name) == graph_.inputs.end()) {
      std::string names;
      for (const std::string& n : graph_.inputs) names += (names.empty() ? "" : ", ") + n;
      throw Error(ErrorKind::kInvalidArgument, "the model has no input named '" + name + "'")
          .hint("its inputs are: " + names);
    }
  std::map<std::string, int64_t> symbols;
  for (const std::string& name : graph_.inputs) {
    auto it = inputs.find(name);
    if (it == inputs.end()) throw Error(ErrorKind::kInvalidArgument, "input '" + name + "' was not given");
    const Tensor& t = it->second;
    const ir::TensorType& want = graph_.value(name).type;
    if (t.dtype() != want.dtype)
      throw Error(ErrorKind::kInvalidArgument, "input '" + name + "' must be " + to_string(want.dtype) +
                                                   ", got " + to_string(t.dtype()));
    if (want.shape) {
      const ir::Dims& dims = *want.shape;
      std::string expected = ir::dims_to_string(dims);
      if (t.rank() != static_cast<int>(dims.size()))
        throw Error(ErrorKind::kInvalidArgument, "input '" + name + "' must have shape " + expected + " (rank " +
                                                     std::to_string(dims.size()) + "), got " + shape_to_string(t.shape()));
      for (size_t i = 0; i < dims.size(); ++i) {
        if (dims[i].known() && dims[i].value != t.shape()[i])
          throw Error(ErrorKind::kInvalidArgument, "input '" + name + "' must have shape " + expected + ", got " +
                                                       shape_to_string(t.shape()));
        if (dims[i].symbolic()) {
          auto [sit, inserted] = symbols.emplace(dims[i].symbol, t.shape()[i]);
          if (!inserted && sit->second != t.shape()[i])
            throw Error(ErrorKind::kInvalidArgument, "dimension '" + dims[i].symbol + "' is " + std::to_string(sit->second) +
                                                         " in one input and " + std::to_string(t.shape()[i]) + " in input '" +
                                                         name + "'");
        }
      }
    }
  }
}

namespace {

bool same_types(const std::vector<ir::TensorType>& a, const std::vector<ir::TensorType>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].dtype != b[i].dtype || a[i].shape != b[i].shape) return false;
  return true;
}

}  // namespace

bool CpuEngine::input_signature(const Step& step, const std::vector<const Tensor*>& values, bool with_values,
                                std::vector<int64_t>& signature) const {
  // Inputs of at most this many elements may carry shapes (pads of a rank-32 tensor at most).
  constexpr int64_t kShapeCarryingElements = 64;
  signature.clear();
  for (size_t i = 0; i < values.size(); ++i) {
    const Tensor* t = values[i];
    if (!t || constant_slots_[static_cast<size_t>(step.inputs[i])].defined()) {
      signature.push_back(t ? -2 : -1);
      continue;
    }
    signature.push_back(static_cast<int64_t>(t->dtype()));
    signature.push_back(static_cast<int64_t>(t->shape().size()));
    signature.insert(signature.end(), t->shape().begin(), t->shape().end());
    if (!with_values) continue;
    if (t->numel() > kShapeCarryingElements) return false;
    // The elements' bytes, 8 to a word (the last word zero-padded).
    const auto* bytes = static_cast<const unsigned char*>(t->raw());
    for (size_t at = 0; at < t->nbytes(); at += 8) {
      int64_t word = 0;
      std::memcpy(&word, bytes + at, std::min<size_t>(8, t->nbytes() - at));
      signature.push_back(word);
    }
  }
  return true;
}

std::map<std::string, Tensor> CpuEngine::run(const std::map<std::string, Tensor>& inputs) const {
  return run_steps(inputs, nullptr);
}

std::map<std::string, Tensor> CpuEngine::run(const std::map<std::string, Tensor>& inputs, StepTimes& times) const {
  return run_steps(inputs, &times);
}

std::map<std::string, Tensor> CpuEngine::run_steps(const std::map<std::string, Tensor>& inputs, StepTimes* times) const {
  check_inputs(inputs);
  std::lock_guard<std::mutex> lock(run_mutex_);
  std::vector<Tensor> slots = constant_slots_;
  for (const auto& [name, t] : inputs) slots[static_cast<size_t>(slots_.at(name))] = t;

  std::vector<ir::TensorType> types;
  std::vector<const ir::TensorType*> type_ptrs;
  std::vector<const Tensor*> values;
  std::vector<const ir::Dims*> no_symbolic;
  std::vector<const Tensor*> no_values;
  std::vector<int64_t> signature;
  std::vector<Tensor> outputs;
  if (times) {
    times->ms.assign(steps_.size(), 0.0);
    times->flops.assign(steps_.size(), 0.0);
    times->bytes.assign(steps_.size(), 0.0);
  }
  for (size_t step_index = 0; step_index < steps_.size(); ++step_index) {
    const Step& step = steps_[step_index];
    const ir::Node& node = *step.node;
    const auto step_start = times ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    values.assign(step.inputs.size(), nullptr);
    for (size_t i = 0; i < step.inputs.size(); ++i) {
      if (step.inputs[i] < 0) continue;
      const Tensor& t = slots[static_cast<size_t>(step.inputs[i])];
      if (!t.defined()) throw node.error(ErrorKind::kInternal, "input '" + node.inputs[i] + "' was not computed");
      values[i] = &t;
    }
    // The inputs' types, for inference and for counting FLOPs.
    auto make_types = [&] {
      types.assign(step.inputs.size(), {});
      type_ptrs.assign(step.inputs.size(), nullptr);
      no_symbolic.assign(step.inputs.size(), nullptr);
      for (size_t i = 0; i < values.size(); ++i) {
        if (!values[i]) continue;
        types[i].dtype = values[i]->dtype();
        types[i].shape = ir::dims_of(values[i]->shape());
        type_ptrs[i] = &types[i];
      }
    };
    // A kernel that makes its outputs sizes them itself: its schema only checks the inputs' types
    // and shapes, without their data (NonMaxSuppression's would run the whole selection to count
    // what it selects, then the kernel would run it again). Other steps infer their output types
    // once per input signature: inference took a few microseconds a step, a few percent of a
    // mobile network's run (docs/design/cpu-gemm.md, "Output types inferred once").
    if (step.makes_outputs) no_values.assign(step.inputs.size(), nullptr);
    const bool reuse = !step.makes_outputs && !step.inferred_for.empty() &&
                       input_signature(step, values, step.values_decide, signature) && signature == step.inferred_for;
    if (!reuse) {
      make_types();
      ir::InferContext ctx = ir::infer_node(node, type_ptrs, step.makes_outputs ? no_values : values, no_symbolic);
      step.inferred_types = std::move(ctx.output_types);
      step.inferred_for.clear();
      if (!step.makes_outputs) {
        // Whether the computed inputs' values decide the types at these shapes: inferred again
        // without them, the types come out otherwise (or not at all).
        no_values.assign(values.size(), nullptr);
        for (size_t i = 0; i < values.size(); ++i)
          if (values[i] && constant_slots_[static_cast<size_t>(step.inputs[i])].defined()) no_values[i] = values[i];
        try {
          step.values_decide = !same_types(ir::infer_node(node, type_ptrs, no_values, no_symbolic).output_types, step.inferred_types);
        } catch (const Error&) {
          step.values_decide = true;
        }
        if (input_signature(step, values, step.values_decide, signature)) step.inferred_for = signature;
      }
    }
    const std::vector<ir::TensorType>& output_types = step.inferred_types;
    outputs.clear();
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      const ir::TensorType& t = output_types[o];
      if (node.outputs[o].empty() || step.makes_outputs) {
        outputs.emplace_back();
        continue;
      }
      if (!t.shape || !ir::all_known(*t.shape))
        // Every input is concrete here, so a schema that still cannot give a shape was handed
        // shape-carrying inputs (pads, sizes, splits...) of the wrong type or with invalid values.
        throw node.error(ErrorKind::kInvalidModel,
                         "cannot determine the shape of output '" + node.outputs[o] +
                             "' from the actual inputs (a shape, size, pads or split input has the wrong "
                             "type or invalid values)");
      // Kernels write every element of their outputs, so no zero-fill (it cost ~5% of a
      // ResNet-50 run); BuildOptions::poison_outputs fills them with 0xFF bytes (NaN) to prove it.
      std::vector<int64_t> shape = ir::known_values(*t.shape);
      std::shared_ptr<unsigned char[]> storage;
      bool in_place = false;
      if (o == 0 && step.overwritable >= 0) {
        const Tensor& in = slots[static_cast<size_t>(step.inputs[static_cast<size_t>(step.overwritable)])];
        // A reshape writes nothing, so it may take any buffer a kernel made (a Loop's output too),
        // not only the pool's; the others write into it, so only into the pool's.
        in_place = in.dtype() == t.dtype &&
                   (step.reshapes ? in.numel() == shape_numel(shape) && in.storage() && in.storage().use_count() == 1
                                  : in.shape() == shape && BufferPool::sole_holder(in));
        if (in_place) storage = in.storage();
      }
      try {
        if (!storage) storage = pool_.take(shape_bytes(shape, t.dtype));
      } catch (Error& e) {
        throw Error(e.kind(), "output '" + node.outputs[o] + "' (" + to_string(t.dtype) + " " + shape_to_string(shape) +
                                  ") " + e.message())
            .node(node.name, node.op)
            .hint(e.hint_text());
      }
      Tensor out = Tensor::over_storage(t.dtype, shape, std::move(storage));
      if (poison_outputs_ && !in_place && out.nbytes()) std::memset(out.raw(), 0xFF, out.nbytes());
      outputs.push_back(std::move(out));
    }
    std::vector<const Tensor*> in_ptrs(values.begin(), values.end());
    try {
      step.kernel->run(in_ptrs, outputs);
    } catch (Error& e) {
      if (e.node_name().empty()) e.node(node.name, node.op);
      throw;
    }
    if (times) {
      if (reuse) make_types();  // for the FLOPs below, while the inputs are still in their slots
      double bytes = 0;
      for (size_t i = 0; i < step.inputs.size(); ++i)
        if (values[i] && !constant_slots_[static_cast<size_t>(step.inputs[i])].defined()) bytes += static_cast<double>(values[i]->nbytes());
      for (const Tensor& out : outputs)
        if (out.defined()) bytes += static_cast<double>(out.nbytes());
      times->bytes[step_index] = bytes;
    }
    for (size_t o = 0; o < step.outputs.size(); ++o) {
      if (step.outputs[o] < 0) continue;
      if (!outputs[o].defined())
        throw node.error(ErrorKind::kInternal, "the kernel made no output '" + node.outputs[o] + "'");
      slots[static_cast<size_t>(step.outputs[o])] = std::move(outputs[o]);
    }
    for (int r : step.release) {
      pool_.give(slots[static_cast<size_t>(r)]);
      slots[static_cast<size_t>(r)] = Tensor();
    }
    if (times) {
      times->ms[step_index] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - step_start).count();
      std::vector<const ir::TensorType*> out_types;
      for (const ir::TensorType& t : output_types) out_types.push_back(&t);
      try {
        times->flops[step_index] = static_cast<double>(ir::node_flops(node, type_ptrs, out_types));
      } catch (const Error&) {
        // a count the schema cannot make at these shapes: left 0, as in EngineInfo
      }
    }
  }
  std::map<std::string, Tensor> result;
  for (const std::string& o : graph_.outputs) result[o] = slots[static_cast<size_t>(slots_.at(o))];
  return result;
}

}  // namespace kiln::cpu
