// CPU kernels of RNN, GRU and LSTM (float32), as ONNX defines them:
//   RNN:  h = f(W x + Wb + R h + Rb)
//   GRU:  z = f(Wz x + Rz h + Wbz + Rbz), r = f(Wr x + Rr h + Wbr + Rbr),
//         n = g(Wh x + Wbh + Rh (r * h) + Rbh)   (linear_before_reset: g(Wh x + Wbh + r * (Rh h + Rbh))),
//         h = (1 - z) * n + z * h
//   LSTM: i = f(Wi x + Ri h + Pi * c + Wbi + Rbi), f = f(Wf x + Rf h + Pf * c + Wbf + Rbf)
//         (input_forget: f = 1 - i), c~ = g(Wc x + Rc h + Wbc + Rbc), c = f * c + i * c~,
//         o = f(Wo x + Ro h + Po * c + Wbo + Rbo), h = o * h(c)
// with the gates in ONNX's order (GRU z, r, h; LSTM i, o, f, c), optional clipping of the gates'
// inputs, the activations of the `activations` attribute, and sequence_lens: a batch entry's
// steps past its length leave Y zero and its state as it was (a reverse pass starts at its last
// step). Sums of products in double.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/kernel.h"
#include "ops/recurrent_params.h"

namespace kiln::cpu {

namespace {

class RecurrentKernel : public Kernel {
 public:
  explicit RecurrentKernel(const KernelInit& init)
      : node_(init.node),
        gates_(node_.op == "LSTM" ? 4 : node_.op == "GRU" ? 3 : 1),
        dirs_(node_.attrs.get_string("direction", "forward") == "bidirectional" ? 2 : 1),
        reverse_only_(node_.attrs.get_string("direction", "forward") == "reverse"),
        batch_first_(node_.attrs.get_int("layout", 0) == 1),
        linear_before_reset_(node_.attrs.get_int("linear_before_reset", 0) != 0),
        input_forget_(node_.attrs.get_int("input_forget", 0) != 0),
        clip_(node_.attrs.has("clip") ? node_.attrs.get_float("clip", 0.f) : -1.f),
        acts_(ir::recurrent_activations(node_, static_cast<int>(dirs_))) {}

  void run(const std::vector<const Tensor*>& in, std::vector<Tensor>& out) override {
    auto input = [&](size_t i) -> const Tensor* { return i < in.size() && in[i] && in[i]->defined() ? in[i] : nullptr; };
    const Tensor& x = *in[0];
    auto fail = [&](const std::string& what) { throw node_.error(ErrorKind::kInvalidArgument, what); };
    if (x.rank() != 3 || in[1]->rank() != 3 || in[2]->rank() != 3) fail("X, W and R must have rank 3");
    const int64_t seq = x.dim(batch_first_ ? 1 : 0), batch = x.dim(batch_first_ ? 0 : 1), feat = x.dim(2);
    const int64_t hidden = in[1]->dim(1) / gates_;
    const int64_t gh = gates_ * hidden;
    const Tensor* bias = input(3);
    const Tensor* lens = input(4);
    const Tensor* h0 = input(5);
    const Tensor* c0 = node_.op == "LSTM" ? input(6) : nullptr;
    const Tensor* peep = node_.op == "LSTM" ? input(7) : nullptr;
    if (hidden <= 0 || in[1]->dim(1) != gh || in[1]->dim(0) != dirs_ || in[1]->dim(2) != feat || in[2]->dim(0) != dirs_ ||
        in[2]->dim(1) != gh || in[2]->dim(2) != hidden)
      fail("W must be [directions, " + std::to_string(gates_) + " x hidden, input] and R [directions, " + std::to_string(gates_) +
           " x hidden, hidden], matching X");
    if (bias && bias->numel() != dirs_ * 2 * gh) fail("B must be [directions, " + std::to_string(2 * gates_) + " x hidden]");
    if (lens && lens->numel() != batch) fail("sequence_lens must have one element per batch entry");
    for (const Tensor* state : {h0, c0})
      if (state && state->numel() != dirs_ * batch * hidden) fail("initial_h and initial_c must be [directions, batch, hidden]");
    if (peep && peep->numel() != dirs_ * 3 * hidden) fail("P must be [directions, 3 x hidden]");
    // Output element offsets.
    auto y_at = [&](int64_t t, int64_t d, int64_t b) { return batch_first_ ? ((b * seq + t) * dirs_ + d) * hidden : ((t * dirs_ + d) * batch + b) * hidden; };
    auto state_at = [&](int64_t d, int64_t b) { return batch_first_ ? (b * dirs_ + d) * hidden : (d * batch + b) * hidden; };
    auto x_at = [&](int64_t t, int64_t b) { return batch_first_ ? (b * seq + t) * feat : (t * batch + b) * feat; };
    float* y = out.size() > 0 && out[0].defined() ? out[0].data<float>() : nullptr;
    float* y_h = out.size() > 1 && out[1].defined() ? out[1].data<float>() : nullptr;
    float* y_c = out.size() > 2 && out[2].defined() ? out[2].data<float>() : nullptr;
    if (y) std::fill(y, y + out[0].numel(), 0.f);
    const float* xv = x.data<float>();
    std::vector<float> h(static_cast<size_t>(hidden)), c(static_cast<size_t>(hidden)), pre(static_cast<size_t>(gh)),
        rh(static_cast<size_t>(gh)), next(static_cast<size_t>(hidden));
    for (int64_t d = 0; d < dirs_; ++d) {
      const bool reverse = reverse_only_ || d == 1;
      const float* w = in[1]->data<float>() + d * gh * feat;
      const float* r = in[2]->data<float>() + d * gh * hidden;
      const float* wb = bias ? bias->data<float>() + d * 2 * gh : nullptr;
      const float* rb = bias ? wb + gh : nullptr;
      const float* p = peep ? peep->data<float>() + d * 3 * hidden : nullptr;
      const std::vector<ir::RecurrentActivation>& act = acts_[static_cast<size_t>(d)];
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t len = lens ? lens->value_as_int(b) : seq;
        if (len < 0 || len > seq)
          throw node_.error(ErrorKind::kInvalidArgument, "sequence_lens[" + std::to_string(b) + "] = " + std::to_string(len) + " is outside [0, " + std::to_string(seq) + "]");
        for (int64_t j = 0; j < hidden; ++j) {
          h[static_cast<size_t>(j)] = h0 ? h0->data<float>()[state_at(d, b) + j] : 0.f;
          c[static_cast<size_t>(j)] = c0 ? c0->data<float>()[state_at(d, b) + j] : 0.f;
        }
        for (int64_t s = 0; s < len; ++s) {
          const int64_t t = reverse ? len - 1 - s : s;
          const float* xt = xv + x_at(t, b);
          for (int64_t g = 0; g < gh; ++g) {
            double sx = wb ? wb[g] : 0.0, sh = rb ? rb[g] : 0.0;
            for (int64_t k = 0; k < feat; ++k) sx += static_cast<double>(w[g * feat + k]) * xt[k];
            for (int64_t k = 0; k < hidden; ++k) sh += static_cast<double>(r[g * hidden + k]) * h[static_cast<size_t>(k)];
            pre[static_cast<size_t>(g)] = static_cast<float>(sx);
            rh[static_cast<size_t>(g)] = static_cast<float>(sh);
          }
          step(act, r, rb, p, hidden, h, c, pre, rh, next);
          if (y) std::copy(h.begin(), h.end(), y + y_at(t, d, b));
        }
        if (y_h) std::copy(h.begin(), h.end(), y_h + state_at(d, b));
        if (y_c) std::copy(c.begin(), c.end(), y_c + state_at(d, b));
      }
    }
  }

 private:
  float clipped(float v) const { return clip_ >= 0.f ? std::max(-clip_, std::min(clip_, v)) : v; }

  // One step from pre = W x + Wb and rh = R h + Rb (per gate row): updates h (and c). R and Rb
  // again for GRU's candidate without linear_before_reset, which multiplies R by r * h.
  void step(const std::vector<ir::RecurrentActivation>& act, const float* r, const float* rb, const float* p, int64_t hidden,
            std::vector<float>& h, std::vector<float>& c, const std::vector<float>& pre, const std::vector<float>& rh,
            std::vector<float>& next) const {
    const auto H = static_cast<size_t>(hidden);
    if (gates_ == 1) {
      for (size_t j = 0; j < H; ++j) next[j] = act[0](clipped(pre[j] + rh[j]));
    } else if (gates_ == 3) {
      std::vector<float> reset(H);
      for (size_t k = 0; k < H; ++k) reset[k] = act[0](clipped(pre[H + k] + rh[H + k]));
      for (size_t j = 0; j < H; ++j) {
        const float z = act[0](clipped(pre[j] + rh[j]));
        float n_in;
        if (linear_before_reset_) {
          n_in = pre[2 * H + j] + reset[j] * rh[2 * H + j];
        } else {
          double s = rb ? rb[2 * H + j] : 0.0;
          for (size_t k = 0; k < H; ++k) s += static_cast<double>(r[(2 * H + j) * H + k]) * reset[k] * h[k];
          n_in = pre[2 * H + j] + static_cast<float>(s);
        }
        const float n = act[1](clipped(n_in));
        next[j] = (1.f - z) * n + z * h[j];
      }
    } else {
      for (size_t j = 0; j < H; ++j) {
        const float pi = p ? p[j] : 0.f, po = p ? p[H + j] : 0.f, pf = p ? p[2 * H + j] : 0.f;
        const float i = act[0](clipped(pre[j] + rh[j] + pi * c[j]));
        const float f = input_forget_ ? 1.f - i : act[0](clipped(pre[2 * H + j] + rh[2 * H + j] + pf * c[j]));
        const float cc = act[1](clipped(pre[3 * H + j] + rh[3 * H + j]));
        const float cn = f * c[j] + i * cc;
        const float o = act[0](clipped(pre[H + j] + rh[H + j] + po * cn));
        c[j] = cn;
        next[j] = o * act[2](cn);
      }
    }
    h.swap(next);
  }

  const ir::Node& node_;
  int64_t gates_, dirs_;
  bool reverse_only_, batch_first_, linear_before_reset_, input_forget_;
  float clip_;
  std::vector<std::vector<ir::RecurrentActivation>> acts_;
};

}  // namespace

KILN_REGISTER_CPU_KERNELS(recurrent) {
  for (const char* op : {"RNN", "GRU", "LSTM"}) {
    KernelEntry e;
    e.op = op;
    e.check = accept_dtypes({DType::kFloat32});
    e.dtypes = "float32";
    e.create = [](const KernelInit& init) { return std::make_unique<RecurrentKernel>(init); };
    registry.add(std::move(e));
  }
}

}  // namespace kiln::cpu
