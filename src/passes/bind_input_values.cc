// Binds graph inputs to given values: each becomes a constant of the graph (no longer an input),
// and every shape is inferred again, so that what depends on its values (a Reduce's axes, a
// Resize's sizes) is known. A GPU engine plans this way for inputs that set parameters
// (BuildOptions::input_values, ir/parameter_inputs.h).
#include <algorithm>

#include "ir/op_schema.h"
#include "passes/passes.h"

namespace kiln::passes {

int bind_input_values(ir::Graph& graph, const std::map<std::string, Tensor>& values) {
  if (values.empty()) return 0;
  for (const auto& [name, tensor] : values) {
    auto it = std::find(graph.inputs.begin(), graph.inputs.end(), name);
    if (it == graph.inputs.end())
      throw Error(ErrorKind::kInvalidArgument, "input values are given for '" + name + "', which is not an input of the model");
    ir::Value& v = graph.value(name);
    if (v.type.dtype != tensor.dtype())
      throw Error(ErrorKind::kInvalidArgument, "the values given for input '" + name + "' are " + to_string(tensor.dtype()) +
                                                   ", the input is " + to_string(v.type.dtype));
    if (!v.type.shape || *v.type.shape != ir::dims_of(tensor.shape()))
      throw Error(ErrorKind::kInvalidArgument, "the values given for input '" + name + "' have shape " +
                                                   shape_to_string(tensor.shape()) + ", the input has " +
                                                   (v.type.shape ? ir::dims_to_string(*v.type.shape) : std::string("no known shape")));
    v.constant = tensor;
    graph.inputs.erase(it);
  }
  ir::reinfer_shapes(graph);  // what inference derived without the values
  return static_cast<int>(values.size());
}

}  // namespace kiln::passes
