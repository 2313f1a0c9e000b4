// Which convolutions the CPU engine runs channels-last (kiln::ChannelsLastConv,
// src/ops/channels_last_conv.cc), for the layout pass the compiler runs before it builds a CPU
// engine (src/passes/channels_last_convs.cc).
#pragma once

#include "ir/graph.h"

namespace kiln::cpu {

// Has this Conv or kiln::FusedConv node a channels-last kernel that reads its input in place:
// 2-D, float32, constant weights, one group or depthwise (one input channel per group), on a
// CPU with AVX-512.
bool channels_last_conv_runs(const ir::Graph& graph, const ir::Node& conv);

}  // namespace kiln::cpu
