// Binds the graph's dynamic input dimensions to numbers (a GPU engine is built for concrete
// shapes), then re-infers every shape from them.
#include <algorithm>

#include "ir/op_schema.h"
#include "passes/passes.h"

namespace kiln::passes {

int bind_input_shapes(ir::Graph& graph, const std::map<std::string, std::vector<int64_t>>& shapes) {
  for (const auto& [name, shape] : shapes)
    if (std::find(graph.inputs.begin(), graph.inputs.end(), name) == graph.inputs.end())
      throw Error(ErrorKind::kInvalidArgument, "the model has no input named '" + name + "'");
  int changed = 0;
  for (const std::string& in : graph.inputs) {
    ir::Value& v = graph.value(in);
    if (!v.type.shape) throw Error(ErrorKind::kInvalidArgument, "input '" + in + "' has no declared rank; give its shape");
    const ir::Dims& declared = *v.type.shape;
    std::vector<int64_t> bound;
    auto given = shapes.find(in);
    if (given != shapes.end()) {
      const std::vector<int64_t>& s = given->second;
      if (s.size() != declared.size())
        throw Error(ErrorKind::kInvalidArgument, "input '" + in + "' has rank " + std::to_string(declared.size()) +
                                                     " (" + ir::dims_to_string(declared) + "), the shape given is " +
                                                     shape_to_string(s));
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] < 0) throw Error(ErrorKind::kInvalidArgument, "input '" + in + "': negative dimension in " + shape_to_string(s));
        if (declared[i].known() && declared[i].value != s[i])
          throw Error(ErrorKind::kInvalidArgument, "input '" + in + "' is declared " + ir::dims_to_string(declared) +
                                                       "; dimension " + std::to_string(i) + " cannot be " + std::to_string(s[i]));
      }
      bound = s;
    } else {
      for (const ir::Dim& d : declared) bound.push_back(d.known() ? d.value : 1);
    }
    if (ir::dims_of(bound) != declared) {
      v.type.shape = ir::dims_of(bound);
      ++changed;
    }
  }
  if (changed) ir::reinfer_shapes(graph);  // shapes further down still name the symbols
  return changed;
}

}  // namespace kiln::passes
