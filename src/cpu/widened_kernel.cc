// Float16 and bfloat16 nodes on float32 kernels (widened_kernel.h says when and why).
#include "cpu/widened_kernel.h"

#include <deque>
#include <vector>

namespace kiln::cpu {

namespace {

bool is_narrow(DType d) { return d == DType::kFloat16 || d == DType::kBFloat16; }

Tensor widen(const Tensor& t) {
  Tensor out(DType::kFloat32, t.shape());
  const uint16_t* src = static_cast<const uint16_t*>(t.raw());
  float* dst = out.data<float>();
  const int64_t n = t.numel();
  if (t.dtype() == DType::kFloat16)
    for (int64_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
  else
    for (int64_t i = 0; i < n; ++i) dst[i] = bfloat16_to_float(src[i]);
  return out;
}

void narrow_into(const Tensor& wide, Tensor& out) {
  if (wide.shape() != out.shape())
    throw Error(ErrorKind::kInternal, "a widened kernel wrote shape " + shape_to_string(wide.shape()) + " for an output of shape " +
                                          shape_to_string(out.shape()));
  const float* src = wide.data<float>();
  uint16_t* dst = static_cast<uint16_t*>(out.raw());
  const int64_t n = out.numel();
  if (out.dtype() == DType::kFloat16)
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_half(src[i]);
  else
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bfloat16(src[i]);
}

class WidenedKernel final : public Kernel {
 public:
  // The float32 types and constants the inner kernel was made from (it may keep pointers to them).
  std::deque<ir::TensorType> types;
  std::deque<Tensor> constants;
  std::vector<bool> widen_input, widen_output;
  std::unique_ptr<Kernel> inner;

  void run(const std::vector<const Tensor*>& inputs, std::vector<Tensor>& outputs) override {
    std::vector<Tensor> widened(inputs.size());
    std::vector<const Tensor*> in(inputs.begin(), inputs.end());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i] && i < widen_input.size() && widen_input[i] && is_narrow(inputs[i]->dtype())) {
        widened[i] = widen(*inputs[i]);
        in[i] = &widened[i];
      }
    std::vector<Tensor> out(outputs.size());
    for (size_t j = 0; j < outputs.size(); ++j)
      out[j] = widen_output[j] && outputs[j].defined() ? Tensor(DType::kFloat32, outputs[j].shape()) : outputs[j];
    inner->run(in, out);
    for (size_t j = 0; j < outputs.size(); ++j) {
      if (widen_output[j] && outputs[j].defined())
        narrow_into(out[j], outputs[j]);
      else
        outputs[j] = out[j];
    }
  }
};

}  // namespace

bool widens_narrow_floats(const KernelEntry& entry) { return !entry.makes_outputs; }

std::unique_ptr<Kernel> make_widened_kernel(const KernelEntry& entry, const KernelInit& init) {
  if (!widens_narrow_floats(entry)) return nullptr;
  auto kernel = std::make_unique<WidenedKernel>();
  KernelInit wide{init.node, {}, {}, {}, init.poison_outputs, init.bfloat16_products};
  bool any = false;
  // The type as the float32 kernel sees it (kept by `kernel`), and whether it was widened.
  auto widened = [&](const ir::TensorType* t, std::vector<bool>& widen) {
    const bool narrow = t && is_narrow(t->dtype);
    widen.push_back(narrow);
    any = any || narrow;
    if (!narrow) return t;
    kernel->types.push_back(*t);
    kernel->types.back().dtype = DType::kFloat32;
    return static_cast<const ir::TensorType*>(&kernel->types.back());
  };
  for (size_t i = 0; i < init.input_types.size(); ++i) {
    wide.input_types.push_back(widened(init.input_types[i], kernel->widen_input));
    const Tensor* c = i < init.constants.size() ? init.constants[i] : nullptr;
    if (c && kernel->widen_input.back()) {
      kernel->constants.push_back(widen(*c));
      c = &kernel->constants.back();
    }
    wide.constants.push_back(c);
  }
  for (const ir::TensorType* t : init.output_types) wide.output_types.push_back(widened(t, kernel->widen_output));
  if (!any || (entry.check && !entry.check(wide).empty())) return nullptr;
  kernel->inner = entry.create(wide);
  return kernel;
}

}  // namespace kiln::cpu
