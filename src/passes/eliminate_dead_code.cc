// Dead-code elimination: drops nodes none of whose outputs reach a graph output, then values
// nothing mentions.
#include <unordered_set>

#include "passes/passes.h"

namespace kiln::passes {

int eliminate_dead_code(ir::Graph& graph) {
  std::unordered_set<std::string> live(graph.outputs.begin(), graph.outputs.end());
  std::vector<bool> keep(graph.nodes.size(), false);
  for (size_t i = graph.nodes.size(); i-- > 0;) {
    const ir::Node& n = graph.nodes[i];
    for (const std::string& o : n.outputs)
      if (!o.empty() && live.count(o)) keep[i] = true;
    if (keep[i]) live.insert(n.inputs.begin(), n.inputs.end());
  }
  std::vector<ir::Node> kept;
  int removed = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (keep[i]) kept.push_back(std::move(graph.nodes[i]));
    else ++removed;
  }
  graph.nodes = std::move(kept);
  graph.prune_values();
  return removed;
}

}  // namespace kiln::passes
