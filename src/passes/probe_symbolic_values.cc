// Learns the elements of small computed integer tensors (shape arithmetic) that symbolic
// inference cannot follow: products such as N*12 (attention heads), and torch's
// expand(-1, ...) pattern, which goes through negative numbers (Where(Equal(s, -1), 1, s)).
//
// It binds every symbolic input dim to a distinctive number, folds the graph's shape
// subgraphs into constants on a copy, and does it again with other numbers. An element that
// is the same in both probes is that constant; one that equals a symbol's number in both
// probes is that symbol; anything else (N*12, data-dependent sizes) stays unknown. The
// result is stored as the value's symbolic_value, which simplify_shape_chains and shape
// inference then use (a Reshape target [17, ?, 64] becomes [17, -1, 64]).
#include <map>
#include <set>

#include "ir/op_schema.h"
#include "passes/passes.h"

namespace kiln::passes {

namespace {

// Small 0-D/1-D integer values computed by nodes: the candidates.
bool is_candidate(const ir::Value& v) {
  if (v.constant) return false;
  if (v.type.dtype != DType::kInt64 && v.type.dtype != DType::kInt32) return false;
  if (!v.type.shape || v.type.shape->size() > 1) return false;
  if (v.type.shape->size() == 1 && (!(*v.type.shape)[0].known() || (*v.type.shape)[0].value > 64)) return false;
  if (v.symbolic_value && ir::all_known(*v.symbolic_value)) return false;
  return true;
}

// The graph with symbol k bound to values[k], shape subgraphs folded; the candidates' values.
std::map<std::string, std::vector<int64_t>> probe(const ir::Graph& graph, const std::vector<std::string>& symbols,
                                                  const std::vector<int64_t>& values,
                                                  const std::set<std::string>& candidates,
                                                  const NodeEvaluator& evaluate) {
  ir::Graph g = graph;
  std::map<std::string, int64_t> binding;
  for (size_t k = 0; k < symbols.size(); ++k) binding[symbols[k]] = values[k];
  for (const std::string& in : g.inputs) {
    ir::Value& v = g.value(in);
    for (ir::Dim& d : *v.type.shape)
      if (d.symbolic()) d = ir::Dim(binding.at(d.symbol));
  }
  // Forget what was inferred with symbols; inference recomputes it with numbers.
  for (const auto& [name, value] : graph.values()) {
    if (value.constant || std::find(g.inputs.begin(), g.inputs.end(), name) != g.inputs.end()) continue;
    ir::Value& v = g.value(name);
    v.type.shape.reset();
    v.symbolic_value.reset();
  }
  // Folding drops values nothing reads any more (a folded Reshape's shape): an Identity per
  // candidate into an extra graph output keeps each one alive (graph outputs are not folded).
  for (const std::string& name : candidates) {
    ir::Node keep;
    keep.op = "Identity";
    keep.name = g.unique_name(name + "_probe_keep");
    keep.inputs = {name};
    keep.outputs = {g.unique_name(name + "_probe_out")};
    g.outputs.push_back(keep.outputs[0]);
    g.nodes.push_back(std::move(keep));
  }
  ir::infer_shapes(g);
  for (int round = 0; round < 8; ++round) {
    if (fold_constants(g, evaluate) == 0) break;
    ir::infer_shapes(g);
  }
  std::map<std::string, std::vector<int64_t>> out;
  for (const std::string& name : candidates) {
    const ir::Value* v = g.find_value(name);
    if (!v) continue;
    if (v->constant) out[name] = v->constant->to_int_vector();
    else if (v->symbolic_value && ir::all_known(*v->symbolic_value)) out[name] = ir::known_values(*v->symbolic_value);
  }
  return out;
}

}  // namespace

int probe_symbolic_values(ir::Graph& graph, const NodeEvaluator& evaluate) {
  std::vector<std::string> symbols;
  for (const std::string& in : graph.inputs) {
    const ir::Value& v = graph.value(in);
    if (!v.type.shape) continue;
    for (const ir::Dim& d : *v.type.shape)
      if (d.symbolic() && std::find(symbols.begin(), symbols.end(), d.symbol) == symbols.end())
        symbols.push_back(d.symbol);
  }
  std::set<std::string> candidates;
  for (const auto& [name, v] : graph.values())
    if (is_candidate(v) && graph.producer(name) >= 0) candidates.insert(name);
  if (symbols.empty() || candidates.empty()) return 0;

  // Odd numbers far from the sizes models use, different per symbol and per probe. Each symbol
  // moves by a different amount between the probes, so no symbol's values are another's plus a
  // constant. A model that cannot take sizes past 1000 (a transformer with 512 positions) is
  // probed again at about a hundred, then at tens.
  std::vector<int64_t> first, second;
  std::map<std::string, std::vector<int64_t>> a, b;
  bool probed = false;
  const std::pair<int64_t, int64_t> bases[] = {{1031, 1543}, {97, 131}, {11, 19}};
  for (const auto& [base_first, base_second] : bases) {
    first.clear();
    second.clear();
    for (size_t k = 0; k < symbols.size(); ++k) {
      first.push_back(base_first + 4 * static_cast<int64_t>(k));
      second.push_back(base_second + 10 * static_cast<int64_t>(k));
    }
    try {
      a = probe(graph, symbols, first, candidates, evaluate);
      b = probe(graph, symbols, second, candidates, evaluate);
      probed = true;
      break;
    } catch (const Error&) {
      // the model cannot take those sizes (e.g. it checks the batch, or has fewer positions)
    }
  }
  if (!probed) return 0;

  int learned = 0;
  for (const std::string& name : candidates) {
    auto ia = a.find(name), ib = b.find(name);
    if (ia == a.end() || ib == b.end() || ia->second.size() != ib->second.size()) continue;
    ir::Value& v = graph.value(name);
    ir::Dims dims;
    for (size_t i = 0; i < ia->second.size(); ++i) {
      int64_t x = ia->second[i], y = ib->second[i];
      ir::Dim d = ir::Dim::unknown();
      if (x == y && x >= 0) {
        d = ir::Dim(x);
      } else {
        for (size_t k = 0; k < symbols.size(); ++k)
          if (x == first[k] && y == second[k]) d = ir::Dim::named(symbols[k]);
      }
      dims.push_back(d);
    }
    std::optional<ir::Dims> before = v.symbolic_value;
    if (before && before->size() == dims.size())
      for (size_t i = 0; i < dims.size(); ++i)
        if (!dims[i].known() && !dims[i].symbolic()) dims[i] = (*before)[i];
    bool gained = !before;
    if (before && before->size() == dims.size())
      for (size_t i = 0; i < dims.size(); ++i)
        if ((!(*before)[i].known() && !(*before)[i].symbolic()) && (dims[i].known() || dims[i].symbolic())) gained = true;
    if (!gained) continue;
    v.symbolic_value = std::move(dims);
    ++learned;
  }
  return learned;
}

}  // namespace kiln::passes
