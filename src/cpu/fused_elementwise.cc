// CPU kernel of kiln::FusedElementwise (ops/fused_elementwise.h): the reference the CUDA layer is
// checked against, and what a GPU engine falls back to. It runs the program step by step over
// whole tensors, with the math of the unfused ops (ir::unary_float, ir::elementwise_binary).
#include <cstring>

#include "cpu/broadcast.h"
#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "ops/fused_elementwise.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kParallelElements = 1 << 16;

// The parts joined along `axis` (same rank, equal dims elsewhere: the schema checked).
Tensor concatenate(const std::vector<const Tensor*>& parts, int axis) {
  std::vector<int64_t> shape = parts[0]->shape();
  shape[static_cast<size_t>(axis)] = 0;
  for (const Tensor* p : parts) shape[static_cast<size_t>(axis)] += p->shape()[static_cast<size_t>(axis)];
  Tensor out(DType::kFloat32, shape);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= shape[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t row = shape[static_cast<size_t>(axis)] * inner;
  float* y = out.data<float>();
  int64_t offset = 0;
  for (const Tensor* p : parts) {
    const int64_t width = p->shape()[static_cast<size_t>(axis)] * inner;
    const float* x = p->data<float>();
    for (int64_t o = 0; o < outer; ++o)
      if (width) std::memcpy(y + o * row + offset, x + o * width, static_cast<size_t>(width) * sizeof(float));
    offset += width;
  }
  return out;
}

// y = f(a[, b]) over y's shape, a and b broadcast to it.
template <class F>
void broadcast_map(const Tensor& a, const Tensor* b, Tensor& y, F f) {
  std::vector<const std::vector<int64_t>*> shapes = {&a.shape()};
  if (b) shapes.push_back(&b->shape());
  const BroadcastPlan plan = plan_broadcast(y.shape(), shapes);
  const int64_t inner = plan.inner(), rows = plan.rows();
  const float* pa = a.data<float>();
  const float* pb = b ? b->data<float>() : nullptr;
  float* py = y.data<float>();
  const int64_t sa = plan.strides[0].back(), sb = b ? plan.strides[1].back() : 0;
  parallel_for(rows, [&](int64_t begin, int64_t end) {
    BroadcastCursor cursor(plan, begin);
    for (int64_t r = begin; r < end; ++r, cursor.next()) {
      const float* ra = pa + cursor.offset(0);
      const float* rb = pb ? pb + cursor.offset(1) : nullptr;
      for (int64_t i = 0; i < inner; ++i) py[r * inner + i] = f(ra[i * sa], rb ? rb[i * sb] : 0.f);
    }
  }, y.numel() > kParallelElements);
}

class FusedElementwiseKernel final : public Kernel {
 public:
  explicit FusedElementwiseKernel(const ir::Node& node) : program_(ir::ElementwiseProgram::of(node)) {}

  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    const ir::ElementwiseProgram& p = program_;
    std::vector<Tensor> owned;  // the concatenation and every step's result
    owned.reserve(p.steps.size() + 1);
    std::vector<const Tensor*> reg;
    size_t next = 0;
    if (p.concat_parts > 0) {
      owned.push_back(concatenate({in.begin(), in.begin() + p.concat_parts}, p.concat_axis));
      reg.push_back(&owned.back());
      next = static_cast<size_t>(p.concat_parts);
    }
    for (; next < in.size(); ++next) reg.push_back(in[next]);
    Tensor& y = out[0];
    for (size_t s = 0; s < p.steps.size(); ++s) {
      const ir::ElementwiseStep& step = p.steps[s];
      Tensor& result = s + 1 == p.steps.size() ? y : owned.emplace_back(DType::kFloat32, y.shape());
      const Tensor& a = *reg[static_cast<size_t>(step.a)];
      if (step.binary) {
        const ir::ElementwiseBinary op = step.binary_op;
        broadcast_map(a, reg[static_cast<size_t>(step.b)], result,
                      [op](float x, float z) { return ir::elementwise_binary(op, x, z); });
      } else {
        ir::with_float_unary_op(step.unary_op, [&](auto tag) {
          constexpr ir::UnaryOp kOp = decltype(tag)::value;
          const ir::UnaryParams params = step.params;
          broadcast_map(a, nullptr, result, [params](float x, float) { return ir::unary_float<kOp>(x, params); });
        });
      }
      reg.push_back(&result);
    }
  }

 private:
  ir::ElementwiseProgram program_;
};

}  // namespace

KILN_REGISTER_CPU_KERNELS(fused_elementwise) {
  KernelEntry e;
  e.op = "FusedElementwise";
  e.domain = "kiln";
  e.check = [](const KernelInit& init) -> std::string {
    for (size_t i = 0; i < init.input_types.size(); ++i)
      if (init.dtype(i) != DType::kFloat32) return "input " + std::to_string(i) + " is not float32";
    return "";
  };
  e.dtypes = "float32";
  e.create = [](const KernelInit& init) -> std::unique_ptr<Kernel> {
    return std::make_unique<FusedElementwiseKernel>(init.node);
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
