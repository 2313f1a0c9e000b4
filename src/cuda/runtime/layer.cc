#include "cuda/runtime/layer.h"

#include "cuda/runtime/run_flag.h"

namespace kiln::cuda {

const char* to_string(Layout layout) { return layout == Layout::kNHWC ? "nhwc" : "linear"; }

const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kTf32: return "tf32";
    case Precision::kFp16: return "fp16";
  }
  return "?";
}

std::string Format::str() const {
  return defined() ? kiln::to_string(dtype) + "/" + to_string(layout) : "none";
}

int64_t TensorSpec::elements() const { return shape_numel(shape); }
size_t TensorSpec::bytes() const { return static_cast<size_t>(elements()) * element_size(format.dtype); }

std::vector<int64_t> TensorSpec::physical_shape() const {
  if (format.layout == Layout::kNHWC && shape.size() == 4) return {shape[0], shape[2], shape[3], shape[1]};
  return shape;
}

std::vector<int64_t> TensorSpec::logical_strides() const {
  std::vector<int64_t> strides(shape.size(), 1);
  if (format.layout == Layout::kNHWC && shape.size() == 4) {
    const int64_t c = shape[1], h = shape[2], w = shape[3];
    strides = {h * w * c, 1, w * c, c};
    return strides;
  }
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

LayerFormats float32_linear_formats(const LayerRequest& r) {
  LayerFormats f;
  for (size_t i = 0; i < r.inputs.size(); ++i)
    f.inputs.push_back(r.given(static_cast<int64_t>(i)) ? Format{DType::kFloat32, Layout::kLinear} : Format{});
  for (DType d : r.output_dtypes) f.outputs.push_back(d == DType::kUndefined ? Format{} : Format{DType::kFloat32, Layout::kLinear});
  return f;
}

namespace {
class LambdaLayer final : public Layer {
 public:
  LambdaLayer(std::string tactic, EnqueueFn fn, size_t workspace)
      : tactic_(std::move(tactic)), fn_(std::move(fn)), workspace_(workspace) {}
  void enqueue(const LayerIO& io, cudaStream_t stream) const override { fn_(io, stream); }
  size_t workspace_bytes() const override { return workspace_; }
  std::string tactic() const override { return tactic_; }

 private:
  std::string tactic_;
  EnqueueFn fn_;
  size_t workspace_;
};
class CheckedLambdaLayer final : public Layer {
 public:
  CheckedLambdaLayer(std::string tactic, CheckedEnqueueFn fn, std::string error, size_t workspace)
      : tactic_(std::move(tactic)), fn_(std::move(fn)), error_(std::move(error)), workspace_(workspace) {}
  void enqueue(const LayerIO& io, cudaStream_t stream) const override { fn_(io, stream, flag_.device()); }
  size_t workspace_bytes() const override { return workspace_; }
  std::string tactic() const override { return tactic_; }
  std::optional<Error> take_failure() const override {
    if (!flag_.take()) return std::nullopt;
    return Error(ErrorKind::kInvalidArgument, error_);
  }

 private:
  std::string tactic_;
  CheckedEnqueueFn fn_;
  std::string error_;
  size_t workspace_;
  RunFlag flag_;
};
}  // namespace

std::unique_ptr<Layer> make_checked_layer(std::string tactic, CheckedEnqueueFn fn, std::string error,
                                          size_t workspace_bytes) {
  return std::make_unique<CheckedLambdaLayer>(std::move(tactic), std::move(fn), std::move(error), workspace_bytes);
}

std::unique_ptr<Layer> make_layer(std::string tactic, EnqueueFn fn, size_t workspace_bytes) {
  return std::make_unique<LambdaLayer>(std::move(tactic), std::move(fn), workspace_bytes);
}

LayerFormats uniform_formats(const LayerRequest& r, bool float16_ok, bool nhwc_ok) {
  LayerFormats f;
  Layout layout = Layout::kLinear;
  if (nhwc_ok && r.has_input(0) && !r.is_constant(0) && r.inputs[0]->format.layout == Layout::kNHWC)
    layout = Layout::kNHWC;
  auto storage = [&](DType logical) {
    if (logical == DType::kFloat32) return float16_ok ? r.float_storage() : DType::kFloat32;
    return logical;
  };
  f.inputs.resize(r.inputs.size());
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    if (!r.has_input(i) || r.is_constant(i)) continue;
    Layout l = r.inputs[i]->rank() == 4 ? layout : Layout::kLinear;
    f.inputs[i] = Format{storage(r.input_dtypes[i]), l};
  }
  for (size_t i = 0; i < r.output_dtypes.size(); ++i) {
    Layout l = r.output_shapes[i].size() == 4 ? layout : Layout::kLinear;
    f.outputs.push_back(Format{storage(r.output_dtypes[i]), l});
  }
  return f;
}

}  // namespace kiln::cuda
