// The SDPA tactic of a build without the cuDNN frontend's headers (CMakeLists.txt): no plan.
#include "cuda/kernels/attention_sdpa.h"

namespace kiln::cuda {

struct SdpaPlan::Impl {};

SdpaPlan::SdpaPlan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SdpaPlan::~SdpaPlan() = default;

std::unique_ptr<SdpaPlan> SdpaPlan::create(const SdpaDims&, cudnnContext*, std::string& why) {
  why = "kiln was built without the cuDNN frontend";
  return nullptr;
}

size_t SdpaPlan::workspace_bytes() const { return 0; }
void SdpaPlan::run(cudnnContext*, const void*, const void*, const void*, const void*, void*, void*) const {}

}  // namespace kiln::cuda
