// Convolutions with a fused epilogue through cuDNN's graph (backend) API:
//   Y = act(conv(X, W) + bias + Z)
// or, for INT8 (int8 X and W, int32 products; per-channel float32 vectors; or FP8 E4M3 X and W,
// float32 products):
//   Y = act((conv(X, W) * scale + bias + Z) * z_mult) * out_mult      (Y int8 or float16)
// as one operation graph (a convolution and pointwise ops on virtual float tensors), for
// which cuDNN's heuristics list engine configurations; each one that finalizes is a tactic
// the conv layer times against the legacy API's algorithms. The graph API reaches the
// runtime-fusion and Hopper-specific engines the legacy calls do not.
#pragma once

#include <cudnn.h>

#include <memory>
#include <string>
#include <vector>

#include "ir/activation.h"

namespace kiln::cuda {

struct ConvGraphSpec {
  std::vector<int64_t> x, w, y;  // logical NCHW-order dims (4-D)
  std::vector<int64_t> pads, strides, dilations;
  bool nhwc = true;                // X, Y, Z (and W as KRSC) channels-last
  cudnnDataType_t io_type = CUDNN_DATA_HALF;  // X, W, Y, Z and bias of a float conv
  bool has_bias = false, has_z = false;
  ir::Activation act;
  // INT8: X and W int8 (io_type is ignored), bias float32, Y and Z of these types; the
  // per-channel vectors of the INT8 form above (scale always; z_mult, out_mult optional).
  // The same with quant_type FP8_E4M3: X and W E4M3, float32 products, and an E4M3 Y
  // saturated to +-448 before cuDNN converts it.
  bool int8 = false;
  cudnnDataType_t quant_type = CUDNN_DATA_INT8;
  cudnnDataType_t y_type = CUDNN_DATA_INT8, z_type = CUDNN_DATA_INT8;
  bool has_z_mult = false, has_out_mult = false;
};

// Device pointers of one run; those the spec does not have are ignored.
struct ConvGraphArgs {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;
  const void* z = nullptr;
  const void* scale = nullptr;
  const void* z_mult = nullptr;
  const void* out_mult = nullptr;
  void* y = nullptr;
};

// True when the activation can be expressed as cuDNN pointwise ops.
bool conv_graph_supports(const ir::Activation& act);

class ConvGraph {
 public:
  // Builds the operation graph and asks cuDNN's heuristics (mode A) for engine configs.
  // Throws kiln::Error (kDevice) if cuDNN refuses the graph itself.
  ConvGraph(cudnnHandle_t handle, const ConvGraphSpec& spec);
  ~ConvGraph();
  ConvGraph(const ConvGraph&) = delete;
  ConvGraph& operator=(const ConvGraph&) = delete;

  // Engine configs the heuristics returned (some may fail to finalize).
  int candidate_count() const;
  // Finalizes candidate i as the execution plan; false when this engine cannot run it, or when
  // cuDNN notes the engine nondeterministic (its results would change with other work on the GPU).
  bool select(cudnnHandle_t handle, int i);
  int selected() const { return selected_; }
  // Frees the plans of the candidates not selected (after tactic timing).
  void drop_other_plans();
  size_t workspace_bytes() const { return workspace_; }
  std::string engine_name() const;

  // Runs the selected plan. bias and z may be null when the spec has none.
  void execute(cudnnHandle_t handle, const void* x, const void* w, const void* bias, const void* z, void* y,
               void* workspace) const;
  void execute(cudnnHandle_t handle, const ConvGraphArgs& args, void* workspace) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int selected_ = -1;
  size_t workspace_ = 0;
};

}  // namespace kiln::cuda
