// CPU kernels of NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (float32, float64),
// as ONNX's reference defines them: loss[n, d] = -weight[t] * x[n, t, d] with t = target[n, d]
// (0 where t is ignore_index); "sum" adds them, "mean" divides the sum by the sum of the weights
// taken (by the count of elements when there are neither weights nor an ignore_index).
// SoftmaxCrossEntropyLoss takes x = log_softmax(scores) over C. Sums are accumulated in double.
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "cpu/kernel.h"

namespace kiln::cpu {

namespace {

template <class T>
void log_softmax(const T* x, T* y, int64_t n, int64_t c, int64_t inner) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < inner; ++d) {
      const T* xs = x + i * c * inner + d;
      T* ys = y + i * c * inner + d;
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k < c; ++k) m = std::max(m, static_cast<double>(xs[k * inner]));
      double sum = 0;
      for (int64_t k = 0; k < c; ++k) sum += std::exp(static_cast<double>(xs[k * inner]) - m);
      const double log_sum = std::log(sum);
      for (int64_t k = 0; k < c; ++k) ys[k * inner] = static_cast<T>(static_cast<double>(xs[k * inner]) - m - log_sum);
    }
}

class LossKernel : public Kernel {
 public:
  explicit LossKernel(const KernelInit& init)
      : node_(init.node),
        softmax_(init.node.op == "SoftmaxCrossEntropyLoss"),
        reduction_(init.node.attrs.get_string("reduction", "mean")) {
    if (init.node.attrs.has("ignore_index")) ignore_index_ = init.node.attrs.get_int("ignore_index", 0);
  }

  void run(const std::vector<const Tensor*>& inputs, std::vector<Tensor>& outputs) override {
    if (inputs[0]->dtype() == DType::kFloat64) compute<double>(inputs, outputs);
    else compute<float>(inputs, outputs);
  }

 private:
  template <class T>
  void compute(const std::vector<const Tensor*>& inputs, std::vector<Tensor>& outputs) {
    const Tensor& scores = *inputs[0];
    const Tensor& targets = *inputs[1];
    const Tensor* weights = inputs.size() > 2 ? inputs[2] : nullptr;
    const std::vector<int64_t>& shape = scores.shape();
    const int64_t n = shape[0], c = shape[1];
    int64_t inner = 1;
    for (size_t d = 2; d < shape.size(); ++d) inner *= shape[d];
    if (weights && weights->numel() != c)
      throw node_.error(ErrorKind::kInvalidArgument, "the weights have " + std::to_string(weights->numel()) +
                                                         " elements for " + std::to_string(c) + " classes");
    const T* x = scores.data<T>();
    std::vector<T> scratch;
    if (softmax_) {
      T* log_prob = nullptr;
      if (outputs.size() > 1 && outputs[1].defined()) {
        log_prob = outputs[1].data<T>();
      } else {
        scratch.resize(static_cast<size_t>(scores.numel()));
        log_prob = scratch.data();
      }
      log_softmax(x, log_prob, n, c, inner);
      x = log_prob;
    }
    const bool weighted = weights || ignore_index_;  // the mean divides by the weights taken
    std::vector<double> loss(static_cast<size_t>(n * inner));
    double weight_sum = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < inner; ++d) {
        const int64_t t = targets.value_as_int(i * inner + d);
        const size_t at = static_cast<size_t>(i * inner + d);
        if (ignore_index_ && t == *ignore_index_) {
          loss[at] = 0;
          continue;
        }
        if (t < 0 || t >= c)
          throw node_.error(ErrorKind::kInvalidArgument, "target " + std::to_string(t) + " is not a class in [0, " +
                                                             std::to_string(c) + ")");
        const double w = weights ? weights->value_as_double(t) : 1.0;
        loss[at] = -w * static_cast<double>(x[(i * c + t) * inner + d]);
        weight_sum += w;
      }
    Tensor& out = outputs[0];
    if (reduction_ == "none") {
      T* y = out.data<T>();
      for (size_t k = 0; k < loss.size(); ++k) y[k] = static_cast<T>(loss[k]);
      return;
    }
    double sum = 0;
    for (double v : loss) sum += v;
    if (reduction_ == "mean") sum /= weighted ? weight_sum : static_cast<double>(loss.size());
    out.data<T>()[0] = static_cast<T>(sum);
  }

  const ir::Node& node_;
  bool softmax_;
  std::string reduction_;
  std::optional<int64_t> ignore_index_;
};

}  // namespace

KILN_REGISTER_CPU_KERNELS(loss) {
  for (const char* op : {"NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"}) {
    KernelEntry e;
    e.op = op;
    e.check = accept_dtypes({DType::kFloat32, DType::kFloat64});
    e.dtypes = "float32, float64";
    e.create = [](const KernelInit& init) { return std::make_unique<LossKernel>(init); };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
