#include "cpu/backend.h"

#include <cpuid.h>

#include "cpu/engine.h"
#include "ir/op_schema.h"

namespace kiln::cpu {

namespace {

class CpuBackendEngine final : public backend::Engine {
 public:
  CpuBackendEngine(ir::Graph graph, size_t memory_limit, bool poison_outputs, bool bfloat16_products)
      : engine_(std::move(graph), memory_limit, poison_outputs, bfloat16_products) {}

  const ir::Graph& graph() const override { return engine_.graph(); }
  size_t layer_count() const override { return engine_.graph().nodes.size(); }

  void describe(EngineInfo& info) const override {
    info.device = "cpu";
    const ir::Graph& g = engine_.graph();
    info.weight_bytes = static_cast<size_t>(g.parameter_bytes());
    for (const ir::Node& n : g.nodes) {
      const ir::Value* out = n.outputs.empty() ? nullptr : g.find_value(n.outputs[0]);
      LayerInfo l{n.name, n.op, layer_tactic(static_cast<size_t>(&n - g.nodes.data())),
                  out ? to_string(out->type.dtype) : "", false, 0, {}};
      if (out && out->type.shape)
        for (const ir::Dim& d : *out->type.shape) l.shape.push_back(d.known() ? d.value : -1);
      try {
        l.flops = static_cast<double>(ir::node_flops(g, n));
      } catch (const Error&) {
      }
      info.layers.push_back(l);
    }
  }

  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) const override {
    return engine_.run(inputs);
  }

  std::unique_ptr<backend::Context> create_context(const ContextOptions&) const override {
    throw Error(ErrorKind::kUnsupported, "execution contexts are for GPU engines; CPU engines run with Engine::run");
  }

  std::unique_ptr<backend::Timer> timer() const override {
    throw Error(ErrorKind::kUnsupported, "the CPU engine has no tactics to time");
  }

  std::vector<LayerTiming> profile(const std::map<std::string, Tensor>& inputs) const override {
    CpuEngine::StepTimes times;
    engine_.run(inputs, times);
    const ir::Graph& g = engine_.graph();
    std::vector<LayerTiming> out;
    for (size_t i = 0; i < times.ms.size() && i < g.nodes.size(); ++i)
      out.push_back(LayerTiming{g.nodes[i].name, g.nodes[i].op, layer_tactic(i), static_cast<float>(times.ms[i]),
                                times.flops[i], times.bytes[i]});
    return out;
  }

 private:
  // "cpu", or "cpu " and how the kernel computes where that is not plain float32.
  std::string layer_tactic(size_t node) const {
    const std::string how = engine_.tactic(node);
    return how.empty() ? "cpu" : "cpu " + how;
  }

  CpuEngine engine_;
};

}  // namespace

std::unique_ptr<backend::Engine> build_backend_engine(ir::Graph graph, size_t memory_limit, bool poison_outputs,
                                                      bool bfloat16_products) {
  return std::make_unique<CpuBackendEngine>(std::move(graph), memory_limit, poison_outputs, bfloat16_products);
}

nlohmann::json device_identity() {
  // CPUID directly: clang's __builtin_cpu_supports does not know "f16c".
  unsigned a = 0, b = 0, c = 0, d = 0;
  bool v3 = false;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    const bool fma = c & (1u << 12), f16c = c & (1u << 29), avx = c & (1u << 28);
    unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
    const bool avx2 = __get_cpuid_count(7, 0, &a7, &b7, &c7, &d7) && (b7 & (1u << 5));
    v3 = fma && f16c && avx && avx2;
  }
  return {{"cpu", "x86-64"}, {"x86_64_v3", v3}};
}

void check_device(const std::string& engine_path) {
  // The CPU kernels are compiled for x86-64-v3: a machine without it would fault on the first
  // AVX2 instruction, so say so instead.
  if (!device_identity().at("x86_64_v3").get<bool>())
    throw Error(ErrorKind::kInvalidArgument, "this CPU lacks AVX2, FMA or F16C, which kiln's CPU engine needs")
        .file(engine_path);
}

}  // namespace kiln::cpu
