#include "cuda/kernels/conv_graph.h"

#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

// One cuDNN backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) { KILN_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  ~Descriptor() { if (d_) cudnnBackendDestroyDescriptor(d_); }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  template <class T>
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const T* value) {
    KILN_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, value));
    return *this;
  }
  Descriptor& set_desc(cudnnBackendAttributeName_t name, const Descriptor& other) {
    cudnnBackendDescriptor_t v = other.d_;
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
  }
  void finalize() { KILN_CUDNN_CHECK(cudnnBackendFinalize(d_)); }
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(d_); }
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

using DescriptorPtr = std::shared_ptr<Descriptor>;

enum Uid : int64_t { kX = 1, kW = 2, kBias = 3, kZ = 4, kY = 5, kScale = 6, kZMult = 7, kOutMult = 8, kVirtual = 100 };

std::vector<int64_t> strides_for(const std::vector<int64_t>& dims, bool nhwc) {
  const int64_t n_ = dims[0], c = dims[1], h = dims[2], w = dims[3];
  (void)n_;
  if (nhwc) return {h * w * c, 1, w * c, c};
  return {c * h * w, h * w, w, 1};
}

DescriptorPtr tensor(int64_t uid, cudnnDataType_t type, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                     bool is_virtual) {
  auto t = std::make_shared<Descriptor>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  int64_t alignment = 16;
  t->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, static_cast<int64_t>(dims.size()), dims.data())
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, static_cast<int64_t>(strides.size()), strides.data())
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  bool v = is_virtual;
  t->set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
  t->finalize();
  return t;
}

// The engine of an engine config (destroyed by the caller), or null.
cudnnBackendDescriptor_t engine_of(cudnnBackendDescriptor_t config) {
  cudnnBackendDescriptor_t engine = nullptr;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS) return nullptr;
  int64_t n = 0;
  if (cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine) !=
      CUDNN_STATUS_SUCCESS) {
    cudnnBackendDestroyDescriptor(engine);
    return nullptr;
  }
  return engine;
}

// Whether cuDNN notes the config's engine as nondeterministic. Such engines (split reductions
// finished in whatever order their blocks arrive) repeat their result while the GPU runs nothing
// else, and differ from it when other work shares the GPU: a context beside another context, or
// beside a PyTorch stream. An engine whose notes cannot be read counts as nondeterministic.
bool nondeterministic(cudnnBackendDescriptor_t config) {
  cudnnBackendDescriptor_t engine = engine_of(config);
  if (!engine) return true;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t n = 0;
  const bool read = cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                             CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) == CUDNN_STATUS_SUCCESS;
  cudnnBackendDestroyDescriptor(engine);
  if (!read) return true;
  for (int64_t i = 0; i < n; ++i)
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return true;
  return false;
}

}  // namespace

bool conv_graph_supports(const ir::Activation& act) {
  using K = ir::ActivationKind;
  switch (act.kind) {
    case K::kNone: case K::kRelu: case K::kClip: case K::kSigmoid: case K::kSiLU: case K::kTanh: case K::kGelu:
    case K::kGeluTanh: case K::kLeakyRelu:
      return true;
    case K::kHardSwish: case K::kHardSigmoid:
      return false;
  }
  return false;
}

struct ConvGraph::Impl {
  std::vector<DescriptorPtr> keep;  // descriptors the graph refers to
  DescriptorPtr graph;
  std::vector<cudnnBackendDescriptor_t> configs;  // owned: destroyed in ~Impl
  std::vector<bool> nondeterministic;              // by config: never selected
  DescriptorPtr plan;
  // Plans already finalized, by candidate: selecting a candidate again (the winner, after
  // the others were timed) reuses its plan; some engines refuse a second finalization.
  std::vector<DescriptorPtr> plans;
  std::vector<size_t> plan_workspace;
  std::vector<int64_t> uids;

  ~Impl() {
    for (cudnnBackendDescriptor_t c : configs) cudnnBackendDestroyDescriptor(c);
  }
};

ConvGraph::ConvGraph(cudnnHandle_t handle, const ConvGraphSpec& s) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const bool fp8 = s.int8 && s.quant_type == CUDNN_DATA_FP8_E4M3;
  const cudnnDataType_t in_type = s.int8 ? s.quant_type : s.io_type;
  const cudnnDataType_t y_type = s.int8 ? s.y_type : s.io_type;
  const cudnnDataType_t z_type = s.int8 ? s.z_type : s.io_type;
  const cudnnDataType_t bias_type = s.int8 ? f32 : s.io_type;
  auto x = tensor(kX, in_type, s.x, strides_for(s.x, s.nhwc), false);
  auto w = tensor(kW, in_type, s.w, strides_for(s.w, s.nhwc), false);
  m.keep = {x, w};
  int64_t next_virtual = kVirtual;
  std::vector<DescriptorPtr> ops;

  // The steps after the convolution, each a pointwise op; the last one writes Y.
  struct Step { cudnnPointwiseMode_t mode; int64_t operand; double lower = 0, upper = 0, slope = 0; bool clip = false; };
  std::vector<Step> steps;
  if (s.int8) steps.push_back({CUDNN_POINTWISE_MUL, kScale});
  if (s.has_bias) steps.push_back({CUDNN_POINTWISE_ADD, kBias});
  if (s.has_z) steps.push_back({CUDNN_POINTWISE_ADD, kZ});
  if (s.int8 && s.has_z_mult) steps.push_back({CUDNN_POINTWISE_MUL, kZMult});
  using K = ir::ActivationKind;
  const K k = s.act.kind;
  if (k == K::kRelu) steps.push_back({CUDNN_POINTWISE_RELU_FWD, 0});
  else if (k == K::kClip) steps.push_back({CUDNN_POINTWISE_RELU_FWD, 0, s.act.alpha, s.act.beta, 0, true});
  else if (k == K::kLeakyRelu) steps.push_back({CUDNN_POINTWISE_RELU_FWD, 0, 0, 0, s.act.alpha, false});
  else if (k == K::kSigmoid) steps.push_back({CUDNN_POINTWISE_SIGMOID_FWD, 0});
  else if (k == K::kSiLU) steps.push_back({CUDNN_POINTWISE_SWISH_FWD, 0});
  else if (k == K::kTanh) steps.push_back({CUDNN_POINTWISE_TANH_FWD, 0});
  else if (k == K::kGelu) steps.push_back({CUDNN_POINTWISE_GELU_FWD, 0});
  else if (k == K::kGeluTanh) steps.push_back({CUDNN_POINTWISE_GELU_APPROX_TANH_FWD, 0});
  else if (k != K::kNone)
    throw Error(ErrorKind::kUnsupported, std::string("activation ") + s.act.name() + " has no cuDNN pointwise form");
  if (s.int8 && s.has_out_mult) steps.push_back({CUDNN_POINTWISE_MUL, kOutMult});
  // E4M3 has no infinity: what cuDNN's conversion does past 448 is not documented, so the value
  // is clamped first (the op's saturation).
  if (fp8 && y_type == CUDNN_DATA_FP8_E4M3) steps.push_back({CUDNN_POINTWISE_RELU_FWD, 0, -448.0, 448.0, 0, true});

  const std::vector<int64_t> y_strides = strides_for(s.y, s.nhwc);
  auto output_of = [&](bool last) {
    return last ? tensor(kY, y_type, s.y, y_strides, false) : tensor(next_virtual++, f32, s.y, y_strides, true);
  };

  // Convolution (INT8: int32 products into an int32 virtual tensor, as cuDNN's INT8 engines want;
  // FP8: float32).
  const cudnnDataType_t compute = s.int8 && !fp8 ? CUDNN_DATA_INT32 : f32;
  auto conv = std::make_shared<Descriptor>(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  int64_t spatial = 2;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  conv->set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial)
      .set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, s.dilations.data())
      .set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, s.strides.data())
      .set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, s.pads.data())
      .set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, s.pads.data());
  conv->finalize();
  DescriptorPtr current = steps.empty() ? output_of(true)
                          : s.int8     ? tensor(next_virtual++, compute, s.y, y_strides, true)
                                       : output_of(false);
  auto conv_op = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
  float alpha = 1.f, beta = 0.f;
  conv_op->set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, *x)
      .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, *w)
      .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, *current)
      .set_desc(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, *conv)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha)
      .set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
  conv_op->finalize();
  m.keep.insert(m.keep.end(), {conv, current});
  ops.push_back(conv_op);

  m.uids = {kX, kW};
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& st = steps[i];
    auto pw = std::make_shared<Descriptor>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &st.mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    if (st.clip) {
      pw->set(CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP, CUDNN_TYPE_DOUBLE, 1, &st.lower)
          .set(CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP, CUDNN_TYPE_DOUBLE, 1, &st.upper);
    }
    if (st.slope != 0) pw->set(CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE, CUDNN_TYPE_DOUBLE, 1, &st.slope);
    if (st.mode == CUDNN_POINTWISE_SWISH_FWD) {
      double b = 1.0;
      pw->set(CUDNN_ATTR_POINTWISE_SWISH_BETA, CUDNN_TYPE_DOUBLE, 1, &b);
    }
    pw->finalize();
    DescriptorPtr out = output_of(i + 1 == steps.size());
    auto op = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *pw)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *current)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *out);
    if (st.operand == kZ) {
      auto z = tensor(kZ, z_type, s.y, y_strides, false);
      op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *z);
      m.keep.push_back(z);
      m.uids.push_back(kZ);
    } else if (st.operand != 0) {  // a per-channel vector: bias, scale or multiplier
      std::vector<int64_t> dims = {1, s.y[1], 1, 1}, strides = {s.y[1], 1, s.y[1], s.y[1]};
      auto b = tensor(st.operand, st.operand == kBias ? bias_type : f32, dims, strides, false);
      op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
      m.keep.push_back(b);
      m.uids.push_back(st.operand);
    }
    op->finalize();
    m.keep.insert(m.keep.end(), {pw, out});
    ops.push_back(op);
    current = out;
  }
  m.uids.push_back(kY);

  m.graph = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> raw;
  for (const DescriptorPtr& op : ops) raw.push_back(op->get());
  m.graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(raw.size()), raw.data())
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  m.graph->finalize();
  m.keep.insert(m.keep.end(), ops.begin(), ops.end());

  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  cudnnBackendHeurMode_t heur_mode = CUDNN_HEUR_MODE_A;
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *m.graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &heur_mode);
  heur.finalize();
  int64_t count = 0;
  KILN_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                            &count, nullptr));
  m.configs.resize(static_cast<size_t>(count));
  for (auto& c : m.configs) KILN_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &c));
  int64_t got = 0;
  KILN_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                            count, &got, m.configs.data()));
  for (int64_t i = got; i < count; ++i) cudnnBackendDestroyDescriptor(m.configs[static_cast<size_t>(i)]);
  m.configs.resize(static_cast<size_t>(got));
  for (cudnnBackendDescriptor_t c : m.configs) m.nondeterministic.push_back(nondeterministic(c));

}

ConvGraph::~ConvGraph() = default;

int ConvGraph::candidate_count() const { return static_cast<int>(impl_->configs.size()); }

bool ConvGraph::select(cudnnHandle_t handle, int i) {
  if (i < 0 || i >= candidate_count()) return false;
  const size_t at = static_cast<size_t>(i);
  if (impl_->nondeterministic[at]) return false;
  impl_->plans.resize(impl_->configs.size());
  impl_->plan_workspace.resize(impl_->configs.size());
  if (!impl_->plans[at]) {
    auto plan = std::make_shared<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    cudnnBackendDescriptor_t config = impl_->configs[at];
    plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
        .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
    if (plan->try_finalize() != CUDNN_STATUS_SUCCESS) return false;
    int64_t ws = 0, n = 0;
    if (cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws) !=
        CUDNN_STATUS_SUCCESS)
      return false;
    impl_->plans[at] = plan;
    impl_->plan_workspace[at] = static_cast<size_t>(ws);
  }
  impl_->plan = impl_->plans[at];
  selected_ = i;
  workspace_ = impl_->plan_workspace[at];
  return true;
}

void ConvGraph::drop_other_plans() {
  for (size_t i = 0; i < impl_->plans.size(); ++i)
    if (static_cast<int>(i) != selected_) impl_->plans[i].reset();
}

std::string ConvGraph::engine_name() const {
  if (selected_ < 0) return "none";
  cudnnBackendDescriptor_t engine = engine_of(impl_->configs[static_cast<size_t>(selected_)]);
  int64_t n = 0, index = -1;
  std::string name = "engine";
  if (engine && cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index) ==
                    CUDNN_STATUS_SUCCESS)
    name = "eng" + std::to_string(index);
  if (engine) cudnnBackendDestroyDescriptor(engine);
  return name;
}

void ConvGraph::execute(cudnnHandle_t handle, const void* x, const void* w, const void* bias, const void* z, void* y,
                        void* workspace) const {
  ConvGraphArgs a;
  a.x = x, a.w = w, a.bias = bias, a.z = z, a.y = y;
  execute(handle, a, workspace);
}

void ConvGraph::execute(cudnnHandle_t handle, const ConvGraphArgs& a, void* workspace) const {
  std::vector<void*> pointers;
  for (int64_t uid : impl_->uids) {
    const void* p = uid == kX ? a.x : uid == kW ? a.w : uid == kBias ? a.bias : uid == kZ ? a.z : uid == kScale ? a.scale
                    : uid == kZMult ? a.z_mult : uid == kOutMult ? a.out_mult : a.y;
    pointers.push_back(const_cast<void*>(p));
  }
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(impl_->uids.size()), impl_->uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()), pointers.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  KILN_CUDNN_CHECK(cudnnBackendExecute(handle, impl_->plan->get(), pack.get()));
}

}  // namespace kiln::cuda
