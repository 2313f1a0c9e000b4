// CPU kernels of DFT and STFT (float32, float64), in double: each line along the axis (STFT: each
// windowed frame) is zero-padded or truncated to the transform's length and transformed by a
// radix-2 FFT when the length is a power of two, else directly (a length whose direct transform
// would take more than kMaxDirectWork multiply-adds in all is refused as unsupported, naming it).
#include <algorithm>
#include <cmath>
#include <complex>
#include <optional>
#include <string>
#include <vector>

#include "cpu/kernel.h"
#include "ops/dft.h"

namespace kiln::cpu {

namespace {

using Complex = std::complex<double>;

constexpr double kPi = 3.14159265358979323846;
constexpr int64_t kMaxDirectWork = int64_t{1} << 31;

bool power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// In place; sign -1 forward, +1 inverse (unnormalized).
void transform(std::vector<Complex>& a, int sign, std::vector<Complex>& scratch) {
  const size_t n = a.size();
  if (power_of_two(static_cast<int64_t>(n))) {
    for (size_t i = 1, j = 0; i < n; ++i) {  // bit-reversal permutation
      size_t bit = n >> 1;
      for (; j & bit; bit >>= 1) j ^= bit;
      j ^= bit;
      if (i < j) std::swap(a[i], a[j]);
    }
    for (size_t len = 2; len <= n; len <<= 1) {
      const double angle = sign * 2 * kPi / static_cast<double>(len);
      for (size_t i = 0; i < n; i += len)
        for (size_t k = 0; k < len / 2; ++k) {
          const Complex w = std::polar(1.0, angle * static_cast<double>(k));
          const Complex u = a[i + k], v = a[i + k + len / 2] * w;
          a[i + k] = u + v;
          a[i + k + len / 2] = u - v;
        }
    }
    return;
  }
  scratch.assign(n, Complex{});
  for (size_t f = 0; f < n; ++f) {
    Complex sum{};
    for (size_t t = 0; t < n; ++t)
      sum += a[t] * std::polar(1.0, sign * 2 * kPi * static_cast<double>((f * t) % n) / static_cast<double>(n));
    scratch[f] = sum;
  }
  a.swap(scratch);
}

template <class T>
void dft(const Tensor& x, const ir::DftParams& p, Tensor& y) {
  const int64_t rank = x.rank(), n = x.dim(p.axis), in_c = x.dim(rank - 1), out_c = p.real_output ? 1 : 2;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < p.axis; ++d) outer *= x.dim(d);
  for (int64_t d = p.axis + 1; d < rank - 1; ++d) inner *= x.dim(d);
  const T* in = x.data<T>();
  T* out = y.data<T>();
  const int64_t L = p.length;
  std::vector<Complex> line(static_cast<size_t>(L)), scratch;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      std::fill(line.begin(), line.end(), Complex{});
      auto at = [&](int64_t t) {
        const T* e = in + ((o * n + t) * inner + i) * in_c;
        return Complex(static_cast<double>(e[0]), in_c == 2 ? static_cast<double>(e[1]) : 0.0);
      };
      if (p.real_output) {
        // A one-sided spectrum: the first L / 2 + 1 bins (as many as there are), the rest by
        // conjugate symmetry.
        const int64_t bins = std::min(n, L / 2 + 1);
        for (int64_t f = 0; f < bins; ++f) line[static_cast<size_t>(f)] = at(f);
        for (int64_t f = L / 2 + 1; f < L; ++f) line[static_cast<size_t>(f)] = std::conj(line[static_cast<size_t>(L - f)]);
      } else {
        for (int64_t t = 0; t < std::min(n, L); ++t) line[static_cast<size_t>(t)] = at(t);
      }
      transform(line, p.inverse ? 1 : -1, scratch);
      for (int64_t f = 0; f < p.out_size; ++f) {
        const Complex v = p.inverse ? line[static_cast<size_t>(f)] / static_cast<double>(L) : line[static_cast<size_t>(f)];
        T* e = out + ((o * p.out_size + f) * inner + i) * out_c;
        e[0] = static_cast<T>(v.real());
        if (out_c == 2) e[1] = static_cast<T>(v.imag());
      }
    }
}

template <class T>
void stft(const Tensor& x, const Tensor* window, const ir::StftParams& p, Tensor& y) {
  const int64_t c = p.complex_input ? 2 : 1, L = p.frame_length;
  const T* in = x.data<T>();
  const T* w = window ? window->data<T>() : nullptr;
  T* out = y.data<T>();
  std::vector<Complex> line(static_cast<size_t>(L)), scratch;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t f = 0; f < p.frames; ++f) {
      for (int64_t t = 0; t < L; ++t) {
        const T* e = in + (b * p.signal_length + f * p.frame_step + t) * c;
        const double scale = w ? static_cast<double>(w[t]) : 1.0;
        line[static_cast<size_t>(t)] = Complex(static_cast<double>(e[0]) * scale, c == 2 ? static_cast<double>(e[1]) * scale : 0.0);
      }
      transform(line, -1, scratch);
      T* o = out + (b * p.frames + f) * p.bins * 2;
      for (int64_t k = 0; k < p.bins; ++k) {
        o[2 * k] = static_cast<T>(line[static_cast<size_t>(k)].real());
        o[2 * k + 1] = static_cast<T>(line[static_cast<size_t>(k)].imag());
      }
    }
}

// Refuses a transform of a length that is not a power of two over `lines` lines when its direct
// form would pass kMaxDirectWork multiply-adds.
void check_direct_work(const ir::Node& node, int64_t length, int64_t lines) {
  if (!power_of_two(length) && lines > kMaxDirectWork / length / length)
    throw Error(ErrorKind::kUnsupported, "a " + node.op + " of length " + std::to_string(length) +
                                             " (not a power of two) over this many lines is too much work for the CPU engine's direct transform")
        .node(node.name, node.op);
}

// The value of an optional scalar input (one element; refused otherwise, naming the node).
std::optional<int64_t> scalar(const ir::Node& node, const Tensor* t, const char* what) {
  if (!t) return std::nullopt;
  if (t->numel() != 1)
    throw Error(ErrorKind::kInvalidArgument, std::string(what) + " must hold one value, has " + std::to_string(t->numel()))
        .node(node.name, node.op);
  return t->value_as_int(0);
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(dft) {
  KernelEntry e;
  e.op = "DFT";
  e.check = accept_dtypes({DType::kFloat32, DType::kFloat64});
  e.dtypes = "float32, float64";
  e.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor& x = *in[0];
      const ir::DftParams p = ir::dft_params(*node, x.shape(), scalar(*node, in.size() > 1 ? in[1] : nullptr, "dft_length"),
                                             scalar(*node, in.size() > 2 ? in[2] : nullptr, "axis"));
      check_direct_work(*node, p.length, x.numel() / std::max<int64_t>(x.dim(p.axis), 1));
      if (x.dtype() == DType::kFloat64) dft<double>(x, p, out[0]);
      else dft<float>(x, p, out[0]);
    });
  };
  registry.add(std::move(e));

  KernelEntry stft_entry;
  stft_entry.op = "STFT";
  stft_entry.check = accept_dtypes({DType::kFloat32, DType::kFloat64});
  stft_entry.dtypes = "float32, float64";
  stft_entry.create = [](const KernelInit& init) {
    const ir::Node* node = &init.node;
    return make_kernel([node](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      const Tensor& x = *in[0];
      const Tensor* window = in.size() > 2 ? in[2] : nullptr;
      if (window && window->rank() != 1) throw Error(ErrorKind::kInvalidArgument, "the window must be 1-D").node(node->name, node->op);
      const ir::StftParams p = ir::stft_params(*node, x.shape(), *scalar(*node, in[1], "frame_step"),
                                               window ? std::optional<int64_t>(window->numel()) : std::nullopt,
                                               scalar(*node, in.size() > 3 ? in[3] : nullptr, "frame_length"));
      check_direct_work(*node, p.frame_length, p.batch * p.frames);
      if (x.dtype() == DType::kFloat64) stft<double>(x, window, p, out[0]);
      else stft<float>(x, window, p, out[0]);
    });
  };
  registry.add(std::move(stft_entry));
}

}  // namespace kiln::cpu
