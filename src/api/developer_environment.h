// The environment variables for kiln's own developers (docs/env.md, second table), all read
// here and nowhere else: each sets a field of the build options, so what it changes is recorded
// in the engine file and in the timing cache's device line like any other option.
#pragma once

#include "kiln/types.h"

namespace kiln::api {

// Sets the fields of `options` that a developer variable asks for (the others stay as given):
//   KILN_PDL=0                 tactics.programmatic_launch = false
//   KILN_GRAPH_TIMING=0        tactics.graph_timing = false
//   KILN_INT8_CONV_TACTIC=V    tactics.quantized_conv = V
//   KILN_INT8_K_SPLITS=N       tactics.int8_k_splits = N
//   KILN_ATTENTION_TACTIC=V    tactics.attention = V
//   KILN_NO_CUDNN_GRAPH        tactics.cudnn_graphs = false
//   KILN_NO_CONV_GEMM          tactics.conv_as_gemm = false
//   KILN_NO_DEPTHWISE_KERNEL   tactics.depthwise_kernel = false
//   KILN_NO_GENERATED_KERNELS  tactics.generated_kernels = false
//   KILN_TACTIC_LOG            tactics.log_candidates = true (and the build's log to stderr)
//   KILN_POISON_OUTPUTS=1      poison_outputs = true
// Throws kInvalidArgument for a value it cannot read, naming the variable.
void apply_developer_environment(BuildOptions& options);

}  // namespace kiln::api
