// CPU kernels of HannWindow, HammingWindow and BlackmanWindow, as ONNX's reference defines them
// (periodic: N = size, else size - 1), computed in double.
#include <cmath>
#include <numbers>

#include "cpu/kernel.h"

namespace kiln::cpu {

KILN_REGISTER_CPU_KERNELS(window) {
  for (const char* op : {"HannWindow", "HammingWindow", "BlackmanWindow"}) {
    KernelEntry e;
    e.op = op;
    e.dtypes = "int32, int64 size -> float32, float64";
    e.create = [](const KernelInit& init) {
      const std::string op_name = init.node.op;
      const bool periodic = init.node.attrs.get_int("periodic", 1) != 0;
      return make_kernel([op_name, periodic](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
        const int64_t size = in[0]->value_as_int(0);
        const double n_total = static_cast<double>(periodic ? size : size - 1);
        const double pi = std::numbers::pi;
        for (int64_t i = 0; i < size; ++i) {
          const double x = static_cast<double>(i);
          double w;
          if (op_name == "HannWindow") {
            const double s = std::sin(x * pi / n_total);
            w = s * s;
          } else if (op_name == "HammingWindow") {
            const double alpha = 25.0 / 46.0;
            w = alpha - std::cos(x * pi * 2 / n_total) * (1 - alpha);
          } else {
            w = 0.42 - 0.5 * std::cos(x * pi * 2 / n_total) + 0.08 * std::cos(x * pi * 4 / n_total);
          }
          if (out[0].dtype() == DType::kFloat64) out[0].data<double>()[i] = w;
          else out[0].data<float>()[i] = static_cast<float>(w);
        }
      });
    };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
