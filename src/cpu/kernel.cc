#include "cpu/kernel.h"

namespace kiln::cpu {

namespace {
class LambdaKernel : public Kernel {
 public:
  explicit LambdaKernel(RunFn fn) : fn_(std::move(fn)) {}
  void run(const std::vector<const Tensor*>& inputs, std::vector<Tensor>& outputs) override {
    fn_(inputs, outputs);
  }

 private:
  RunFn fn_;
};
}  // namespace

std::unique_ptr<Kernel> make_kernel(RunFn fn) { return std::make_unique<LambdaKernel>(std::move(fn)); }

KernelRegistry& KernelRegistry::instance() {
  static KernelRegistry registry;
  return registry;
}

void KernelRegistry::add(KernelEntry entry) {
  std::string key = entry.domain + "::" + entry.op;
  entries_[key] = std::move(entry);
}

const KernelEntry* KernelRegistry::find(const std::string& op, const std::string& domain) const {
  auto it = entries_.find(domain + "::" + op);
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<const KernelEntry*> KernelRegistry::all() const {
  std::vector<const KernelEntry*> out;
  for (const auto& [k, v] : entries_) out.push_back(&v);
  return out;
}

std::function<std::string(const KernelInit&)> accept_dtypes(std::vector<DType> dtypes) {
  return [dtypes](const KernelInit& init) -> std::string {
    DType d = init.dtype(0);
    for (DType ok : dtypes)
      if (d == ok) return "";
    std::string list;
    for (DType ok : dtypes) list += (list.empty() ? "" : ", ") + to_string(ok);
    return "input type " + to_string(d) + " is not supported (supported: " + list + ")";
  };
}

}  // namespace kiln::cpu
