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
// step).
//
// Two paths. With AVX-512 and constant W and R (the usual case) the products run on kiln's sgemm
// (src/cpu/sgemm.h): W^T and R^T are packed once, when the kernel is made; every step's input
// projection X W^T + Wb is one product over all steps; each step's R h + Rb is one product over
// the batch (its columns split over the threads, so each core keeps its share of R in L2; a
// bidirectional layer's two directions instead run on a core each); the gates' sigmoids and
// tanhs run 16 at a time. Sums in float32, as ONNX Runtime takes them. Otherwise the reference
// loops run: every sum of products in double, one gate row at a time.

// GCC 12's own AVX-512 intrinsics start from an "undefined" vector and trip
// -Wmaybe-uninitialized when inlined here; the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/gemm_util.h"
#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "cpu/sgemm.h"
#include "cpu/vector_exp.h"
#include "ops/recurrent_params.h"

namespace kiln::cpu {

namespace {

// v[i] = f(v[i]): Sigmoid and Tanh 16 at a time, the other functions one by one.
__attribute__((target("avx512f"))) void activate(const ir::RecurrentActivation& f, float* v, int64_t n) {
  using Kind = ir::RecurrentActivationKind;
  int64_t i = 0;
  if (f.kind == Kind::kSigmoid) {
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(v + i, sigmoid16(_mm512_loadu_ps(v + i)));
  } else if (f.kind == Kind::kTanh) {
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(v + i, tanh16(_mm512_loadu_ps(v + i)));
  }
  for (; i < n; ++i) v[i] = f(v[i]);
}

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
        acts_(ir::recurrent_activations(node_, static_cast<int>(dirs_))) {
    const Tensor* w = init.constants.size() > 1 ? init.constants[1] : nullptr;
    const Tensor* r = init.constants.size() > 2 ? init.constants[2] : nullptr;
    if (sgemm_isa() != SgemmIsa::kAvx512 || !w || !r || w->dtype() != DType::kFloat32 || r->dtype() != DType::kFloat32 ||
        w->rank() != 3 || r->rank() != 3 || w->dim(0) != dirs_ || r->dim(0) != dirs_ || r->dim(2) <= 0 ||
        w->dim(1) != gates_ * r->dim(2) || r->dim(1) != w->dim(1))
      return;  // the reference loops check and report the shapes
    const int64_t feat = w->dim(2), hidden = r->dim(2), gh = gates_ * hidden;
    // GRU without linear_before_reset multiplies Rh by r * h, not h: its columns get a product
    // of their own.
    const int64_t joint = split_candidate() ? 2 * hidden : gh;
    std::vector<float> t;
    for (int64_t d = 0; d < dirs_; ++d) {
      t.resize(static_cast<size_t>(std::max(feat, hidden) * gh));
      transpose_floats(w->data<float>() + d * gh * feat, gh, feat, t.data());  // W^T [feat x gh]
      input_weights_.emplace_back().pack(t.data(), feat, gh, gh);
      transpose_floats(r->data<float>() + d * gh * hidden, gh, hidden, t.data());  // R^T [hidden x gh]
      state_weights_.emplace_back().pack(t.data(), hidden, joint, gh);
      if (split_candidate()) candidate_weights_.emplace_back().pack(t.data() + 2 * hidden, hidden, hidden, gh);
    }
  }

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
    std::vector<int64_t> lengths(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      lengths[static_cast<size_t>(b)] = lens ? lens->value_as_int(b) : seq;
      if (lengths[static_cast<size_t>(b)] < 0 || lengths[static_cast<size_t>(b)] > seq)
        throw node_.error(ErrorKind::kInvalidArgument, "sequence_lens[" + std::to_string(b) + "] = " +
                                                           std::to_string(lengths[static_cast<size_t>(b)]) + " is outside [0, " +
                                                           std::to_string(seq) + "]");
    }
    if (!input_weights_.empty() && input_weights_[0].depth() == feat && input_weights_[0].cols() == gh &&
        state_weights_[0].depth() == hidden) {
      Sizes z{seq, batch, feat, hidden};
      run_packed(z, x.data<float>(), bias, lengths, h0, c0, peep, y, y_h, y_c);
      return;
    }
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
        const int64_t len = lengths[static_cast<size_t>(b)];
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
  struct Sizes {
    int64_t seq, batch, feat, hidden;
  };

  bool split_candidate() const { return gates_ == 3 && !linear_before_reset_; }

  float clipped(float v) const { return clip_ >= 0.f ? std::max(-clip_, std::min(clip_, v)) : v; }
  void clip_all(float* v, int64_t n) const {
    if (clip_ >= 0.f)
      for (int64_t i = 0; i < n; ++i) v[i] = clipped(v[i]);
  }

  // The AVX-512 path (the file's comment): per direction, the input projection of every step,
  // then per step the state product over the batch and the gates of the entries still running.
  void run_packed(const Sizes& z, const float* x, const Tensor* bias, const std::vector<int64_t>& lengths, const Tensor* h0,
                  const Tensor* c0, const Tensor* peep, float* y, float* y_h, float* y_c) const {
    const int64_t H = z.hidden, gh = gates_ * H, B = z.batch, joint = split_candidate() ? 2 * H : gh;
    // The two directions of a bidirectional layer are independent: each runs on a core of its
    // own, its products on that core, instead of both cores meeting at every step of each.
    const bool directions_apart = dirs_ == 2 && thread_count() >= 2;
    const int threads = directions_apart ? 1 : thread_count();
    auto y_at = [&](int64_t t, int64_t d, int64_t b) {
      return batch_first_ ? ((b * z.seq + t) * dirs_ + d) * H : ((t * dirs_ + d) * B + b) * H;
    };
    auto state_at = [&](int64_t d, int64_t b) { return batch_first_ ? (b * dirs_ + d) * H : (d * B + b) * H; };
    auto x_row = [&](int64_t t, int64_t b) { return batch_first_ ? b * z.seq + t : t * B + b; };
    int64_t longest = 0;
    for (int64_t len : lengths) longest = std::max(longest, len);
    auto direction = [&](int64_t d) {
      std::vector<float> pre(static_cast<size_t>(z.seq * B * gh)), rh(static_cast<size_t>(B * joint)),
          h(static_cast<size_t>(B * H)), c(static_cast<size_t>(B * H)), gate(static_cast<size_t>(4 * H));
      std::vector<float> reset_h(split_candidate() ? static_cast<size_t>(B * H) : 0), rn(reset_h.size());
      const bool reverse = reverse_only_ || d == 1;
      const float* wb = bias ? bias->data<float>() + d * 2 * gh : nullptr;
      const float* rb = bias ? wb + gh : nullptr;
      const float* p = peep ? peep->data<float>() + d * 3 * H : nullptr;
      const std::vector<ir::RecurrentActivation>& act = acts_[static_cast<size_t>(d)];
      rows_sgemm(input_weights_[static_cast<size_t>(d)], z.seq * B, x, z.feat, pre.data(), gh, wb, nullptr, 0, nullptr, threads);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < H; ++j) {
          h[static_cast<size_t>(b * H + j)] = h0 ? h0->data<float>()[state_at(d, b) + j] : 0.f;
          c[static_cast<size_t>(b * H + j)] = c0 ? c0->data<float>()[state_at(d, b) + j] : 0.f;
        }
      for (int64_t s = 0; s < longest; ++s) {
        // R h + Rb for every entry (those already finished are computed and not used).
        rows_sgemm(state_weights_[static_cast<size_t>(d)], B, h.data(), H, rh.data(), joint, rb, nullptr, 0, nullptr, threads);
        if (split_candidate()) {
          // The reset gate of every running entry, then Rh (r * h) + Rbh.
          for (int64_t b = 0; b < B; ++b) {
            float* rr = reset_h.data() + b * H;
            if (s >= lengths[static_cast<size_t>(b)]) {
              std::fill(rr, rr + H, 0.f);
              continue;
            }
            const int64_t t = reverse ? lengths[static_cast<size_t>(b)] - 1 - s : s;
            const float* pt = pre.data() + x_row(t, b) * gh;
            const float* rt = rh.data() + b * joint;
            for (int64_t k = 0; k < H; ++k) rr[k] = pt[H + k] + rt[H + k];
            clip_all(rr, H);
            activate(act[0], rr, H);
            for (int64_t k = 0; k < H; ++k) rr[k] *= h[static_cast<size_t>(b * H + k)];
          }
          rows_sgemm(candidate_weights_[static_cast<size_t>(d)], B, reset_h.data(), H, rn.data(), H, rb ? rb + 2 * H : nullptr,
                     nullptr, 0, nullptr, threads);
        }
        for (int64_t b = 0; b < B; ++b) {
          if (s >= lengths[static_cast<size_t>(b)]) continue;
          const int64_t t = reverse ? lengths[static_cast<size_t>(b)] - 1 - s : s;
          step_packed(act, p, H, pre.data() + x_row(t, b) * gh, rh.data() + b * joint,
                      split_candidate() ? rn.data() + b * H : nullptr, h.data() + b * H, c.data() + b * H, gate.data());
          if (y) std::copy(h.begin() + b * H, h.begin() + (b + 1) * H, y + y_at(t, d, b));
        }
      }
      for (int64_t b = 0; b < B; ++b) {
        if (y_h) std::copy(h.begin() + b * H, h.begin() + (b + 1) * H, y_h + state_at(d, b));
        if (y_c) std::copy(c.begin() + b * H, c.begin() + (b + 1) * H, y_c + state_at(d, b));
      }
    };
    if (directions_apart) {
      parallel_for_each(2, true, direction, 1);
    } else {
      for (int64_t d = 0; d < dirs_; ++d) direction(d);
    }
  }

  // One entry's step on the AVX-512 path: pt = W x + Wb and rt = R h + Rb (its first 2H columns
  // for GRU without linear_before_reset, whose rn = Rh (r * h) + Rbh); updates h (and c).
  void step_packed(const std::vector<ir::RecurrentActivation>& act, const float* p, int64_t H, const float* pt,
                   const float* rt, const float* rn, float* h, float* c, float* gate) const {
    if (gates_ == 1) {
      for (int64_t j = 0; j < H; ++j) gate[j] = pt[j] + rt[j];
      clip_all(gate, H);
      activate(act[0], gate, H);
      std::copy(gate, gate + H, h);
      return;
    }
    if (gates_ == 3) {
      float* zg = gate;
      float* rg = gate + H;
      float* ng = gate + 2 * H;
      for (int64_t j = 0; j < 2 * H; ++j) gate[j] = pt[j] + rt[j];
      clip_all(gate, 2 * H);
      activate(act[0], gate, 2 * H);
      if (linear_before_reset_)
        for (int64_t j = 0; j < H; ++j) ng[j] = pt[2 * H + j] + rg[j] * rt[2 * H + j];
      else
        for (int64_t j = 0; j < H; ++j) ng[j] = pt[2 * H + j] + rn[j];
      clip_all(ng, H);
      activate(act[1], ng, H);
      for (int64_t j = 0; j < H; ++j) h[j] = (1.f - zg[j]) * ng[j] + zg[j] * h[j];
      return;
    }
    float* ig = gate;
    float* og = gate + H;
    float* fg = gate + 2 * H;
    float* cg = gate + 3 * H;
    for (int64_t j = 0; j < H; ++j) {
      ig[j] = pt[j] + rt[j] + (p ? p[j] * c[j] : 0.f);
      fg[j] = pt[2 * H + j] + rt[2 * H + j] + (p ? p[2 * H + j] * c[j] : 0.f);
      cg[j] = pt[3 * H + j] + rt[3 * H + j];
    }
    clip_all(ig, H);
    activate(act[0], ig, H);
    if (input_forget_) {
      for (int64_t j = 0; j < H; ++j) fg[j] = 1.f - ig[j];
    } else {
      clip_all(fg, H);
      activate(act[0], fg, H);
    }
    clip_all(cg, H);
    activate(act[1], cg, H);
    for (int64_t j = 0; j < H; ++j) {
      c[j] = fg[j] * c[j] + ig[j] * cg[j];
      og[j] = pt[H + j] + rt[H + j] + (p ? p[H + j] * c[j] : 0.f);
    }
    clip_all(og, H);
    activate(act[0], og, H);
    std::copy(c, c + H, cg);  // h(c) on a copy: c is the state
    activate(act[2], cg, H);
    for (int64_t j = 0; j < H; ++j) h[j] = og[j] * cg[j];
  }

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
  // The AVX-512 path's packed weights, per direction (empty: the reference loops run): W^T,
  // R^T (for GRU without linear_before_reset its z and r columns) and that GRU's Rh^T.
  std::vector<PackedColumns> input_weights_, state_weights_, candidate_weights_;
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
