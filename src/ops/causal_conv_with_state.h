// CausalConvWithState (opset 27): a causal, depthwise 1-D convolution that carries its state
// between calls, as Mamba's and Gated DeltaNet's decoders step through a sequence. For input
// [B, C, L], weight [C, 1, K], optional bias [C] and past_state [B, C, K - 1] (zeros when absent):
// each channel's row is [past_state, input], the output [B, C, L] is its valid convolution with
// that channel's kernel (plus bias), optionally through SiLU ("silu", or its alias "swish"), and
// present_state [B, C, K - 1] is the row's last K - 1 positions. One reading of the node for its
// schema and its CPU kernel.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

struct CausalConvParams {
  int64_t batch = 0, channels = 0, length = 0, kernel = 0;
  bool silu = false;  // activation "silu" or "swish"
};

// The activation attribute: "none" (the default), "silu" or "swish"; anything else is
// kInvalidModel naming the node.
bool causal_conv_silu(const Node& node);

// Checks the shapes (input, weight, and bias and past_state where given) against each other and
// reads the activation; kInvalidModel naming the node and the mismatch otherwise.
CausalConvParams causal_conv_params(const Node& node, const std::vector<int64_t>& input,
                                    const std::vector<int64_t>& weight,
                                    const std::optional<std::vector<int64_t>>& bias,
                                    const std::optional<std::vector<int64_t>>& past_state);

}  // namespace kiln::ir
