// cuDNN's fused attention through the cuDNN frontend: one SDPA graph per shape, Q, K, V and
// the output read and written where they are (any strides with a contiguous last axis), the
// logits never leaving the chip. Support is cuDNN's to say (head sizes, alignment, this cuDNN
// version and GPU): create() returns nullptr with its message when it declines.
#include "cuda/kernels/attention_sdpa.h"

#include <cudnn_frontend.h>

#include <unordered_map>
#include <vector>

#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kOut, kBias };

std::vector<int64_t> dims4(int64_t a, int64_t b, int64_t c, int64_t d) { return {a, b, c, d}; }
std::vector<int64_t> strides4(const int64_t (&s)[4]) { return {s[0], s[1], s[2], s[3]}; }

}  // namespace

struct SdpaPlan::Impl {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  bool bias = false;
};

SdpaPlan::SdpaPlan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SdpaPlan::~SdpaPlan() = default;

std::unique_ptr<SdpaPlan> SdpaPlan::create(const SdpaDims& d, cudnnContext* handle, std::string& why) {
  auto impl = std::make_unique<Impl>();
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  using fe::graph::Tensor_attributes;
  auto q = graph->tensor(Tensor_attributes().set_name("Q").set_uid(kQ)
                             .set_dim(dims4(d.batch, d.q_heads, d.queries, d.head_size)).set_stride(strides4(d.q_strides)));
  auto k = graph->tensor(Tensor_attributes().set_name("K").set_uid(kK)
                             .set_dim(dims4(d.batch, d.kv_heads, d.keys, d.head_size)).set_stride(strides4(d.k_strides)));
  auto v = graph->tensor(Tensor_attributes().set_name("V").set_uid(kV)
                             .set_dim(dims4(d.batch, d.kv_heads, d.keys, d.v_head_size)).set_stride(strides4(d.v_strides)));
  auto options = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(false).set_attn_scale(d.scale);
  if (d.causal) options.set_causal_mask(true);
  if (d.bias) {
    auto bias = graph->tensor(Tensor_attributes().set_name("bias").set_uid(kBias)
                                  .set_dim(dims4(d.bias_batch, d.bias_heads, d.queries, d.keys))
                                  .set_stride(dims4(d.bias_heads * d.queries * d.keys, d.queries * d.keys, d.keys, 1)));
    options.set_bias(bias);
    impl->bias = true;
  }
  auto [out, stats] = graph->sdpa(q, k, v, options);
  (void)stats;
  out->set_output(true).set_uid(kOut).set_dim(dims4(d.batch, d.q_heads, d.queries, d.v_head_size))
      .set_stride(strides4(d.o_strides));
  auto failed = [&](fe::error_t e, const char* step) {
    if (e.is_good()) return false;
    why = std::string("cuDNN's fused attention: ") + step + ": " + e.get_message();
    return true;
  };
  if (failed(graph->validate(), "validate") || failed(graph->build_operation_graph(handle), "operation graph") ||
      failed(graph->create_execution_plans({fe::HeurMode_t::A}), "execution plans") ||
      failed(graph->check_support(handle), "support") || failed(graph->build_plans(handle), "build"))
    return nullptr;
  if (failed(graph->get_workspace_size(impl->workspace), "workspace")) return nullptr;
  impl->graph = std::move(graph);
  return std::unique_ptr<SdpaPlan>(new SdpaPlan(std::move(impl)));
}

size_t SdpaPlan::workspace_bytes() const { return static_cast<size_t>(impl_->workspace); }

void SdpaPlan::run(cudnnContext* handle, const void* q, const void* k, const void* v, const void* bias, void* out,
                   void* workspace) const {
  std::unordered_map<int64_t, void*> pack = {
      {kQ, const_cast<void*>(q)}, {kK, const_cast<void*>(k)}, {kV, const_cast<void*>(v)}, {kOut, out}};
  if (impl_->bias) pack[kBias] = const_cast<void*>(bias);
  fe::error_t e = impl_->graph->execute(handle, pack, workspace);
  if (!e.is_good()) throw Error(ErrorKind::kInternal, "cuDNN's fused attention failed: " + e.get_message());
}

}  // namespace kiln::cuda
