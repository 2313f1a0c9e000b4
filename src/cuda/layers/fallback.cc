// CPU fallback (automatic partitioning; `--strict` refuses it): a node without a GPU layer runs
// the CPU engine's kernel inside the GPU engine. Its inputs go to pinned host memory, the kernel
// runs in a host callback on the stream, and its outputs come back; all three are stream
// operations (a plan with such a layer runs without a CUDA graph: CudaContext::enqueue says
// why). It serializes the GPU around it: for coverage, not speed. The pinned staging and the
// kernel belong to the layer, and every execution context builds its own layers
// (CudaEngine::context_plan), so contexts running at once never share them. A kernel that fails poisons its outputs (NaN bytes) and keeps the
// error, which CudaContext::run throws once the run has finished (take_failure).
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>

#include "cpu/kernel.h"
#include "cpu/widened_kernel.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/engine.h"
#include "ir/sizes.h"

namespace kiln::cuda {

namespace {

struct PinnedDeleter {
  void operator()(unsigned char* p) const { cudaFreeHost(p); }
};

std::shared_ptr<unsigned char[]> pinned(size_t bytes) {
  void* p = nullptr;
  KILN_CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 64)));
  return std::shared_ptr<unsigned char[]>(static_cast<unsigned char*>(p), PinnedDeleter());
}

class CpuFallbackLayer final : public Layer {
 public:
  CpuFallbackLayer(const LayerRequest& r) : node_(r.node) {
    for (size_t i = 0; i < r.inputs.size(); ++i) {
      types_.push_back(ir::TensorType{});
      if (!r.has_input(i)) continue;
      types_.back().dtype = r.input_dtypes[i];
      types_.back().shape = ir::dims_of(r.inputs[i]->shape);
    }
    for (size_t i = 0; i < r.output_shapes.size(); ++i)
      out_types_.push_back(ir::TensorType{r.output_dtypes[i], ir::dims_of(r.output_shapes[i])});
    cpu::KernelInit init{node_, {}, {}, {}};
    for (size_t i = 0; i < types_.size(); ++i) {
      init.input_types.push_back(r.has_input(i) ? &types_[i] : nullptr);
      init.constants.push_back(r.is_constant(i) ? r.constants[i] : nullptr);
    }
    for (const ir::TensorType& t : out_types_) init.output_types.push_back(&t);
    const cpu::KernelEntry* entry = cpu::KernelRegistry::instance().find(node_.op, node_.domain);
    if (!entry) throw node_.error(ErrorKind::kUnsupported, "no GPU layer and no CPU kernel for " + node_.op);
    if (entry->makes_outputs)  // If: the sizes the GPU engine plans ahead are known only once it has run
      throw node_.error(ErrorKind::kUnsupported,
                        "no GPU layer, and its outputs' shapes are known only when it has run, which the GPU engine's "
                        "memory plan cannot take (the CPU engine runs it: --device cpu)");
    // As the CPU engine does: a kernel without a check takes every node, and float16/bfloat16
    // values a kernel refuses run through its float32 form.
    const std::string why = entry->check ? entry->check(init) : "";
    kernel_ = why.empty() ? entry->create(init) : cpu::make_widened_kernel(*entry, init);
    if (!kernel_) throw node_.error(ErrorKind::kUnsupported, "no GPU layer, and the CPU kernel refuses it: " + why);
    for (size_t i = 0; i < r.inputs.size(); ++i) {
      if (!r.has_input(i)) {
        host_inputs_.push_back(Tensor());
      } else if (r.is_constant(i)) {
        host_inputs_.push_back(*r.constants[i]);
      } else {
        const size_t bytes = checked_bytes(r.inputs[i]->shape, r.input_dtypes[i]);
        host_inputs_.push_back(Tensor::over_storage(r.input_dtypes[i], r.inputs[i]->shape, pinned(bytes)));
        runtime_inputs_.push_back(i);
      }
    }
    for (size_t i = 0; i < r.output_shapes.size(); ++i) {
      if (r.output_dtypes[i] == DType::kUndefined) {  // an omitted optional output
        host_outputs_.push_back(Tensor());
        continue;
      }
      const size_t bytes = checked_bytes(r.output_shapes[i], r.output_dtypes[i]);
      host_outputs_.push_back(Tensor::over_storage(r.output_dtypes[i], r.output_shapes[i], pinned(bytes)));
    }
  }

  void enqueue(const LayerIO& io, cudaStream_t stream) const override {
    for (size_t i : runtime_inputs_)
      KILN_CUDA_CHECK(cudaMemcpyAsync(host_inputs_[i].storage().get(), io.inputs[i], host_inputs_[i].nbytes(),
                                      cudaMemcpyDeviceToHost, stream));
    KILN_CUDA_CHECK(cudaLaunchHostFunc(stream, &CpuFallbackLayer::run_on_host, const_cast<CpuFallbackLayer*>(this)));
    for (size_t i = 0; i < host_outputs_.size(); ++i)
      if (io.outputs[i] && host_outputs_[i].defined())
        KILN_CUDA_CHECK(cudaMemcpyAsync(io.outputs[i], host_outputs_[i].storage().get(), host_outputs_[i].nbytes(),
                                        cudaMemcpyHostToDevice, stream));
  }

  std::string tactic() const override { return "cpu-fallback"; }

  std::optional<Error> take_failure() const override {
    if (!failed_.load(std::memory_order_acquire)) return std::nullopt;
    std::lock_guard<std::mutex> lock(failure_mutex_);
    std::optional<Error> failure = std::move(failure_);
    failure_.reset();
    failed_.store(false, std::memory_order_release);
    return failure;
  }

 private:
  static size_t checked_bytes(const std::vector<int64_t>& shape, DType dtype) {
    return static_cast<size_t>(
        checked_mul(shape_numel(shape), static_cast<int64_t>(element_size(dtype)), "a CPU fallback tensor's size"));
  }

  static void CUDART_CB run_on_host(void* self) {
    auto* layer = static_cast<CpuFallbackLayer*>(self);
    std::vector<const Tensor*> inputs;
    for (const Tensor& t : layer->host_inputs_) inputs.push_back(t.defined() ? &t : nullptr);
    std::optional<Error> failure;
    try {
      layer->kernel_->run(inputs, layer->host_outputs_);
    } catch (const Error& e) {
      failure = e;
      if (failure->node_name().empty()) failure->node(layer->node_.name, layer->node_.op);
    } catch (const std::exception& e) {
      failure = layer->node_.error(ErrorKind::kInternal, std::string("the CPU kernel failed: ") + e.what());
    }
    if (!failure) return;
    // A host callback cannot throw into the stream: poison the outputs so the failure cannot
    // pass for a result, report it, and keep it for CudaContext::run to throw.
    for (Tensor& t : layer->host_outputs_)
      if (t.defined()) std::memset(t.raw(), 0xFF, t.nbytes());
    std::fprintf(stderr, "kiln: CPU fallback of node '%s' failed: %s\n", layer->node_.name.c_str(), failure->what());
    std::lock_guard<std::mutex> lock(layer->failure_mutex_);
    layer->failure_ = std::move(failure);
    layer->failed_.store(true, std::memory_order_release);
  }

  ir::Node node_;
  std::vector<ir::TensorType> types_, out_types_;
  std::unique_ptr<cpu::Kernel> kernel_;
  std::vector<Tensor> host_inputs_;
  std::vector<size_t> runtime_inputs_;
  mutable std::vector<Tensor> host_outputs_;
  mutable std::mutex failure_mutex_;
  mutable std::optional<Error> failure_;
  mutable std::atomic<bool> failed_{false};
};

}  // namespace

std::unique_ptr<Layer> make_cpu_fallback_layer(const LayerRequest& request, const LayerFormats&) {
  return std::make_unique<CpuFallbackLayer>(request);
}

}  // namespace kiln::cuda
