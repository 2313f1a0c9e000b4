#include "api/developer_environment.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kiln/error.h"

namespace kiln::api {

namespace {

const char* variable(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

}  // namespace

void apply_developer_environment(BuildOptions& options) {
  TacticOptions& t = options.tactics;
  if (const char* v = variable("KILN_PDL")) t.programmatic_launch = std::string(v) != "0";
  if (const char* v = variable("KILN_GRAPH_TIMING")) t.graph_timing = std::string(v) != "0";
  if (const char* v = variable("KILN_INT8_CONV_TACTIC")) {
    const std::string only = v;
    if (only != "cudnn" && only != "cublaslt" && only != "cutlass" && only != "kernel" && only.rfind("kernel:", 0) != 0 &&
        only.rfind("cutlass:", 0) != 0)
      throw Error(ErrorKind::kInvalidArgument, "KILN_INT8_CONV_TACTIC='" + only +
                                                   "' is none of cudnn, cublaslt, cutlass, cutlass:NAME, kernel, kernel:NAME");
    t.quantized_conv = only;
  }
  if (const char* v = variable("KILN_ATTENTION_TACTIC")) {
    const std::string only = v;
    if (only != "products" && only != "cudnn" && only != "kernel")
      throw Error(ErrorKind::kInvalidArgument, "KILN_ATTENTION_TACTIC='" + only + "' is none of products, cudnn, kernel");
    t.attention = only;
  }
  if (const char* v = variable("KILN_INT8_K_SPLITS")) {
    const std::string splits = v;
    if (splits != "1" && splits != "2" && splits != "4" && splits != "8")
      throw Error(ErrorKind::kInvalidArgument, "KILN_INT8_K_SPLITS='" + splits + "' is none of 1, 2, 4, 8");
    t.int8_k_splits = std::atoi(v);
  }
  if (variable("KILN_NO_CUDNN_GRAPH")) t.cudnn_graphs = false;
  if (variable("KILN_NO_CONV_GEMM")) t.conv_as_gemm = false;
  if (variable("KILN_NO_DEPTHWISE_KERNEL")) t.depthwise_kernel = false;
  if (variable("KILN_NO_GENERATED_KERNELS")) t.generated_kernels = false;
  if (variable("KILN_TACTIC_LOG")) {
    t.log_candidates = true;
    // The candidates' lines are for a developer's terminal even where the caller is quiet.
    if (!options.log) options.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  }
  if (const char* v = variable("KILN_POISON_OUTPUTS")) options.poison_outputs = std::string(v) == "1";
}

}  // namespace kiln::api
