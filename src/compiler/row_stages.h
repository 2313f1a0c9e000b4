// The CPU tail of a GPU build (data_dependent_split.h) holds everything after the first node whose
// output shapes the data decides. In a detection model that is not only box selection but also
// the per-region heads after it: a box head's fully connected layers, a mask head's convolutions,
// most of the model's arithmetic after the backbone. They are in the tail only because how many
// regions reach them is known after a run; each region (a row: index 0 of the first dimension) is
// computed on its own. A row stage is such a part of the tail: nodes that compute each row from the
// same row of one value and from constants, with at least one matrix product or convolution among
// them. The GPU runs a stage up to a fixed number of rows at a time, padded with zero rows to a
// power of two (staged_tail_engine.h; docs/design/control-flow.md, "Per-region heads on the GPU").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::compiler {

struct RowStage {
  std::string rows;                  // the value the stage reads, its first dimension decided by the data
  std::vector<size_t> nodes;         // the stage's nodes, as indices into the graph's nodes, in graph order
  std::vector<std::string> outputs;  // the values it computes that other nodes or the graph's outputs read
};

// The row stages of `graph` (a tail, shapes inferred: a row value's first dimension unknown, its
// others known), in graph order. Each stage reads one such value and constants only, no node of
// one stage reads another's outputs except through the rest of the graph, and each holds a Conv,
// ConvTranspose, Gemm (A not transposed) or 2-D MatMul with constant weights (or kiln's fused
// forms of them, without a residual input); Flatten (axis 1), Relu, LeakyRelu, Sigmoid and Tanh
// join the stage of what they read.
std::vector<RowStage> find_row_stages(const ir::Graph& graph);

// `stage` as a graph of its own, its input `stage.rows` with a first dimension named "rows",
// shapes inferred from it.
ir::Graph row_stage_graph(const ir::Graph& graph, const RowStage& stage);

}  // namespace kiln::compiler
