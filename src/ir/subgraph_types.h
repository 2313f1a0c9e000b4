// The output types of a control-flow node's subgraph, from the subgraph's own inference, for
// subgraphs that do not declare them. The ONNX importer reads subgraphs (src/onnx/control_flow.cc)
// and provides the function; the schemas of If, Loop and Scan (src/ops/control_flow.cc), a stage
// that may not call the importer, ask for it here.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

// The types of the outputs of `model` (an ONNX model's bytes) when its inputs have `inputs`'
// types; throws kiln::Error naming `name` when the model cannot be read or inferred.
using SubgraphTyper = std::vector<TensorType> (*)(const std::string& model, const std::vector<TensorType>& inputs,
                                                  const std::string& name);

void set_subgraph_typer(SubgraphTyper typer);
// nullptr until the importer has set it (a program without the ONNX importer).
SubgraphTyper subgraph_typer();

}  // namespace kiln::ir
