#include "compiler/staged_tail_engine.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>

namespace kiln::compiler {

namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The CPU part of `tail`'s nodes at `indices`: reads what it does not compute (constants aside),
// computes what `read_later` holds of its nodes' outputs.
ir::Graph cpu_part(const ir::Graph& tail, const std::vector<size_t>& indices, const std::set<std::string>& read_later) {
  ir::Graph part = tail;
  part.nodes.clear();
  part.inputs.clear();
  part.outputs.clear();
  std::set<std::string> computed;
  for (size_t i : indices) {
    const ir::Node& n = tail.nodes[i];
    for (const std::string& in : n.inputs)
      if (!in.empty() && !computed.count(in) && !tail.constant(in) && !contains(part.inputs, in)) part.inputs.push_back(in);
    for (const std::string& out : n.outputs)
      if (!out.empty()) {
        computed.insert(out);
        if (read_later.count(out)) part.outputs.push_back(out);
      }
    part.nodes.push_back(n);
  }
  part.prune_values();
  return part;
}

// Rows [first, first + count) of `t`: a view of its storage where they start on a 64-byte
// boundary (what a tensor's storage promises its readers), else a copy.
Tensor rows_of(const Tensor& t, int64_t first, int64_t count) {
  std::vector<int64_t> shape = t.shape();
  const size_t row_bytes = shape[0] ? t.nbytes() / static_cast<size_t>(shape[0]) : 0;
  const size_t offset = static_cast<size_t>(first) * row_bytes;
  shape[0] = count;
  if (offset % 64 == 0)
    return Tensor::over_storage(t.dtype(), std::move(shape), std::shared_ptr<unsigned char[]>(t.storage(), t.storage().get() + offset));
  Tensor copy = Tensor::uninitialized(t.dtype(), std::move(shape));
  std::memcpy(copy.raw(), static_cast<const unsigned char*>(t.raw()) + offset, static_cast<size_t>(count) * row_bytes);
  return copy;
}

// The smallest power of two at least `rows`, at most `limit`: the row counts a stage runs at, so
// that its engine plans (and keeps the CUDA graphs of) a few shapes, not one per count.
int64_t planned_rows(int64_t rows, int64_t limit) {
  int64_t planned = 1;
  while (planned < rows) planned *= 2;
  return std::min(planned, limit);
}

// A stage's engine and the context it runs in, one run at a time.
struct StageRunner {
  std::unique_ptr<backend::Context> context;  // none where the engine has no contexts (CPU engines, in tests)
  std::mutex mutex;
};

class StagedTailEngine final : public backend::Engine {
 public:
  StagedTailEngine(ir::Graph tail, std::vector<TailPart> parts) : tail_(std::move(tail)), parts_(std::move(parts)) {
    for (const TailPart& p : parts_) {
      if (!p.engine) throw Error(ErrorKind::kInternal, "a part of the CPU tail has no engine");
      layer_count_ += p.engine->layer_count();
      runners_.push_back(std::make_unique<StageRunner>());
      if (!p.stage) continue;
      if (p.rows_per_run < 1) throw Error(ErrorKind::kInternal, "a row stage runs no rows at a time");
      try {
        runners_.back()->context = p.engine->create_context(ContextOptions{});
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kUnsupported) throw;
      }
    }
  }

  const ir::Graph& graph() const override { return tail_; }
  size_t layer_count() const override { return layer_count_; }
  void describe(EngineInfo& info) const override {
    for (const TailPart& p : parts_) {
      EngineInfo part;
      p.engine->describe(part);
      info.layers.insert(info.layers.end(), part.layers.begin(), part.layers.end());
      info.weight_bytes += part.weight_bytes;
    }
    info.device = "cpu";
  }
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) const override {
    std::map<std::string, Tensor> values = inputs;
    for (size_t k = 0; k < parts_.size(); ++k) {
      const TailPart& p = parts_[k];
      std::map<std::string, Tensor> in;
      for (const std::string& name : p.graph.inputs) {
        auto it = values.find(name);
        if (it == values.end()) throw Error(ErrorKind::kInvalidArgument, "input '" + name + "' was not given");
        in.emplace(name, it->second);
      }
      std::map<std::string, Tensor> out = p.stage ? run_rows(p, *runners_[k], in.at(p.stage->rows)) : p.engine->run(in);
      for (auto& [name, t] : out) values[name] = std::move(t);
    }
    std::map<std::string, Tensor> outputs;
    for (const std::string& name : tail_.outputs) {
      auto it = values.find(name);
      if (it == values.end()) throw Error(ErrorKind::kInternal, "no part of the CPU tail computed output '" + name + "'");
      outputs.emplace(name, it->second);
    }
    return outputs;
  }
  std::unique_ptr<backend::Context> create_context(const ContextOptions&) const override {
    throw Error(ErrorKind::kUnsupported, "the CPU tail of a GPU engine runs with Engine::run");
  }
  std::map<std::string, std::string> tactics() const override {
    std::map<std::string, std::string> all;
    for (const TailPart& p : parts_) {
      std::map<std::string, std::string> t = p.engine->tactics();
      all.insert(t.begin(), t.end());
    }
    return all;
  }
  std::unique_ptr<backend::Timer> timer() const override {
    throw Error(ErrorKind::kUnsupported, "the CPU tail of a GPU engine has no tactics to time");
  }
  std::vector<LayerTiming> profile(const std::map<std::string, Tensor>&) const override {
    throw Error(ErrorKind::kUnsupported, "the CPU tail of a GPU engine runs only whole (Engine::run)");
  }

 private:
  // `rows` and `padding` zero rows after them through the stage's engine.
  static std::map<std::string, Tensor> run_padded(const TailPart& p, StageRunner& runner, const Tensor& rows,
                                                  int64_t padding) {
    const std::string& name = p.stage->rows;
    // A context writes the zero rows on the device; an engine without contexts takes them from the host.
    if (runner.context) return runner.context->run_concatenated({{name, {rows}}}, padding);
    std::vector<int64_t> shape = rows.shape();
    shape[0] += padding;
    Tensor padded(rows.dtype(), shape);
    if (rows.nbytes()) std::memcpy(padded.raw(), rows.raw(), rows.nbytes());
    return p.engine->run({{name, padded}});
  }

  // The stage `p` over every row of `rows`: up to p.rows_per_run rows a run, each run's rows
  // padded with zeros to a power of two. The outputs of a single run are views of the engine's.
  static std::map<std::string, Tensor> run_rows(const TailPart& p, StageRunner& runner, const Tensor& rows) {
    const std::string& name = p.stage->rows;
    const ir::Value& planned = p.graph.value(name);
    const ir::Dims& dims = *planned.type.shape;
    if (rows.dtype() != planned.type.dtype || rows.rank() != static_cast<int>(dims.size()) ||
        !std::equal(dims.begin() + 1, dims.end(), rows.shape().begin() + 1,
                    [](const ir::Dim& d, int64_t v) { return d.known() && d.value == v; }))
      throw Error(ErrorKind::kInternal, "value '" + name + "' reaches the GPU's stage as " + to_string(rows.dtype()) + " " +
                                            shape_to_string(rows.shape()) + ", not as it was built for");
    const int64_t count = rows.dim(0), at_once = p.rows_per_run;
    std::map<std::string, Tensor> outputs;
    if (count == 0) {
      for (const std::string& out : p.graph.outputs) {
        const ir::Value& v = p.graph.value(out);
        std::vector<int64_t> shape{0};
        for (size_t d = 1; d < v.type.shape->size(); ++d) shape.push_back((*v.type.shape)[d].value);
        outputs.emplace(out, Tensor(v.type.dtype, shape));
      }
      return outputs;
    }
    std::lock_guard<std::mutex> lock(runner.mutex);
    for (int64_t first = 0; first < count; first += at_once) {
      const int64_t taken = std::min(at_once, count - first);
      std::map<std::string, Tensor> got =
          run_padded(p, runner, count <= at_once ? rows : rows_of(rows, first, taken), planned_rows(taken, at_once) - taken);
      for (const std::string& out : p.graph.outputs) {
        const Tensor& part = got.at(out);
        if (part.rank() < 1 || part.dim(0) < taken)
          throw Error(ErrorKind::kInternal, "the GPU's stage returned output '" + out + "' without the rows it was given");
        if (count <= at_once) {
          outputs[out] = rows_of(part, 0, count);
          continue;
        }
        if (first == 0) {
          std::vector<int64_t> shape = part.shape();
          shape[0] = count;
          outputs[out] = Tensor::uninitialized(part.dtype(), shape);
        }
        Tensor& whole = outputs.at(out);
        const size_t row_bytes = part.nbytes() / static_cast<size_t>(part.dim(0));
        if (part.dtype() != whole.dtype() || row_bytes * static_cast<size_t>(count) != whole.nbytes())
          throw Error(ErrorKind::kInternal, "the GPU's stage returned output '" + out + "' in another shape from run to run");
        std::memcpy(static_cast<unsigned char*>(whole.raw()) + static_cast<size_t>(first) * row_bytes, part.raw(),
                    static_cast<size_t>(taken) * row_bytes);
      }
    }
    return outputs;
  }

  ir::Graph tail_;
  std::vector<TailPart> parts_;
  std::vector<std::unique_ptr<StageRunner>> runners_;  // one per part (used by stages)
  size_t layer_count_ = 0;
};

}  // namespace

std::vector<TailPart> tail_parts(const ir::Graph& tail, const std::vector<RowStage>& stages, int64_t rows_per_run) {
  std::vector<int> stage_of(tail.nodes.size(), -1);
  for (size_t s = 0; s < stages.size(); ++s)
    for (size_t i : stages[s].nodes) stage_of[i] = static_cast<int>(s);

  // The order: a stage whole where its first node is (its nodes read only its `rows`, computed
  // before that node, and each other), the nodes between stages in runs.
  struct Run {
    int stage = -1;
    std::vector<size_t> nodes;
  };
  std::vector<Run> runs;
  std::vector<bool> placed(stages.size(), false);
  for (size_t i = 0; i < tail.nodes.size(); ++i) {
    const int s = stage_of[i];
    if (s >= 0) {
      if (placed[static_cast<size_t>(s)]) continue;
      placed[static_cast<size_t>(s)] = true;
      runs.push_back(Run{s, stages[static_cast<size_t>(s)].nodes});
      continue;
    }
    if (runs.empty() || runs.back().stage >= 0) runs.push_back(Run{});
    runs.back().nodes.push_back(i);
  }

  std::vector<TailPart> parts(runs.size());
  for (size_t r = 0; r < runs.size(); ++r) {
    if (runs[r].stage >= 0) {
      const RowStage& stage = stages[static_cast<size_t>(runs[r].stage)];
      parts[r].stage = stage;
      parts[r].graph = row_stage_graph(tail, stage);
      parts[r].rows_per_run = rows_per_run;
      continue;
    }
    // What the runs after this one and the tail's outputs read.
    std::set<std::string> read_later(tail.outputs.begin(), tail.outputs.end());
    for (size_t later = r + 1; later < runs.size(); ++later)
      for (size_t i : runs[later].nodes)
        for (const std::string& in : tail.nodes[i].inputs) read_later.insert(in);
    parts[r].graph = cpu_part(tail, runs[r].nodes, read_later);
  }
  return parts;
}

std::unique_ptr<backend::Engine> make_staged_tail_engine(ir::Graph tail, std::vector<TailPart> parts) {
  return std::make_unique<StagedTailEngine>(std::move(tail), std::move(parts));
}

}  // namespace kiln::compiler
