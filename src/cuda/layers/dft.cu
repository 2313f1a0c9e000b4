// CUDA layers of DFT and STFT (float32, float64; float32 kept float32 under fp16), the CPU
// kernels' semantics (src/cpu/dft.cc, ops/dft.h: zero padding or truncation to the transform's
// length, inverse and one-sided transforms, the one-sided inverse's real output, STFT's frames
// and window), computed directly: one thread per output element sums its line's products with
// the twiddles e^(-+2 pi i f t / L) in double. The CPU engine takes power-of-two lengths through
// a radix-2 FFT, so the two agree to double rounding, not bit for bit. Direct sums cost L
// multiply-adds an output: transforms of more than 2^34 in all are left to the CPU engine.
// dft_length, axis, frame_step and frame_length must be constants (or planned input values).
#include <optional>
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "ops/dft.h"

namespace kiln::cuda {

namespace {

constexpr int64_t kMaxDirectWork = int64_t{1} << 34;

struct DftGeom {
  int64_t outer = 0, n = 0, inner = 0, in_c = 1, out_c = 2, length = 0, out_size = 0, outputs = 0;
  bool inverse = false, real_output = false;
};

template <class T>
__device__ __forceinline__ void load_complex(const T* __restrict__ x, int64_t at, int64_t channels, double& re, double& im) {
  re = static_cast<double>(x[at * channels]);
  im = channels == 2 ? static_cast<double>(x[at * channels + 1]) : 0.0;
}

template <class T>
__global__ void dft_kernel(const T* __restrict__ x, T* __restrict__ y, DftGeom g) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  const double sign = g.inverse ? 1.0 : -1.0;
  const int64_t L = g.length;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < g.outputs; e += step) {
    const int64_t i = e % g.inner, f = (e / g.inner) % g.out_size, o = e / (g.inner * g.out_size);
    auto at = [&](int64_t t) { return (o * g.n + t) * g.inner + i; };
    double sum_re = 0, sum_im = 0;
    const int64_t bins = g.n < L / 2 + 1 ? g.n : L / 2 + 1;
    for (int64_t t = 0; t < L; ++t) {
      double re = 0, im = 0;
      if (g.real_output) {  // a one-sided spectrum: the bins there are, the rest by conjugate symmetry
        if (t < bins) load_complex(x, at(t), g.in_c, re, im);
        else if (t >= L / 2 + 1 && L - t < bins) load_complex(x, at(L - t), g.in_c, re, im), im = -im;
      } else if (t < g.n) {
        load_complex(x, at(t), g.in_c, re, im);
      }
      if (re == 0 && im == 0) continue;
      double s, c;
      sincospi(sign * 2.0 * static_cast<double>((f * t) % L) / static_cast<double>(L), &s, &c);
      sum_re += re * c - im * s;
      sum_im += re * s + im * c;
    }
    if (g.inverse) sum_re /= static_cast<double>(L), sum_im /= static_cast<double>(L);
    T* out = y + ((o * g.out_size + f) * g.inner + i) * g.out_c;
    out[0] = static_cast<T>(sum_re);
    if (g.out_c == 2) out[1] = static_cast<T>(sum_im);
  }
}

struct StftGeom {
  int64_t batch = 0, signal_length = 0, frame_step = 0, frame_length = 0, frames = 0, bins = 0, channels = 1, outputs = 0;
};

template <class T>
__global__ void stft_kernel(const T* __restrict__ x, const T* __restrict__ window, T* __restrict__ y, StftGeom g) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x, L = g.frame_length;
  for (int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < g.outputs; e += step) {
    const int64_t k = e % g.bins, frame = (e / g.bins) % g.frames, b = e / (g.bins * g.frames);
    double sum_re = 0, sum_im = 0;
    for (int64_t t = 0; t < L; ++t) {
      double re, im;
      load_complex(x, b * g.signal_length + frame * g.frame_step + t, g.channels, re, im);
      const double w = window ? static_cast<double>(window[t]) : 1.0;
      re *= w, im *= w;
      double s, c;
      sincospi(-2.0 * static_cast<double>((k * t) % L) / static_cast<double>(L), &s, &c);
      sum_re += re * c - im * s;
      sum_im += re * s + im * c;
    }
    y[e * 2] = static_cast<T>(sum_re);
    y[e * 2 + 1] = static_cast<T>(sum_im);
  }
}

// The value of an optional scalar parameter input: nullopt when absent; throws when it is not a
// constant of one element.
std::optional<int64_t> constant_scalar(const LayerRequest& r, size_t i, const char* what) {
  if (!r.given(i)) return std::nullopt;
  if (!r.is_constant(i)) throw Error(ErrorKind::kUnsupported, std::string(what) + " must be a constant");
  if (r.constants[i]->numel() != 1) throw Error(ErrorKind::kInvalidModel, std::string(what) + " must hold one value");
  return r.constants[i]->value_as_int(0);
}

bool float_type(DType d) { return d == DType::kFloat32 || d == DType::kFloat64; }

std::string dft_geometry(const LayerRequest& r, DftGeom& g) {
  if (!float_type(r.input_dtypes[0])) return "input type " + to_string(r.input_dtypes[0]) + " is not supported (supported: float32, float64)";
  const std::vector<int64_t>& shape = r.input_shape(0);
  const ir::DftParams p = ir::dft_params(r.node, shape, constant_scalar(r, 1, "dft_length"), constant_scalar(r, 2, "axis"));
  const int64_t rank = static_cast<int64_t>(shape.size());
  g = DftGeom{};
  g.outer = 1, g.inner = 1;
  for (int64_t d = 0; d < p.axis; ++d) g.outer *= shape[static_cast<size_t>(d)];
  for (int64_t d = p.axis + 1; d < rank - 1; ++d) g.inner *= shape[static_cast<size_t>(d)];
  g.n = shape[static_cast<size_t>(p.axis)], g.in_c = shape.back(), g.out_c = p.real_output ? 1 : 2;
  g.length = p.length, g.out_size = p.out_size, g.inverse = p.inverse, g.real_output = p.real_output;
  g.outputs = g.outer * g.out_size * g.inner;
  if (g.length > 0 && g.outputs > kMaxDirectWork / g.length) return "a transform of more than 2^34 multiply-adds (the CPU engine's FFT takes it)";
  return "";
}

std::string stft_geometry(const LayerRequest& r, StftGeom& g) {
  if (!float_type(r.input_dtypes[0])) return "input type " + to_string(r.input_dtypes[0]) + " is not supported (supported: float32, float64)";
  if (r.given(2) && (r.input_dtypes[2] != r.input_dtypes[0] || r.input_shape(2).size() != 1)) return "the window must be 1-D, of the signal's type";
  const std::optional<int64_t> step = constant_scalar(r, 1, "frame_step");
  if (!step) return "frame_step is required";
  const ir::StftParams p = ir::stft_params(r.node, r.input_shape(0), *step,
                                           r.given(2) ? std::optional<int64_t>(r.input_shape(2)[0]) : std::nullopt,
                                           constant_scalar(r, 3, "frame_length"));
  g = StftGeom{};
  g.batch = p.batch, g.signal_length = p.signal_length, g.frame_step = p.frame_step, g.frame_length = p.frame_length;
  g.frames = p.frames, g.bins = p.bins, g.channels = p.complex_input ? 2 : 1;
  g.outputs = g.batch * g.frames * g.bins;
  if (g.frame_length > 0 && g.outputs > kMaxDirectWork / g.frame_length)
    return "a transform of more than 2^34 multiply-adds (the CPU engine's FFT takes it)";
  return "";
}

template <class Geom, class Fn>
std::string checked(const LayerRequest& r, Fn geometry) {
  Geom g;
  try {
    return geometry(r, g);
  } catch (const Error& e) {
    return e.what();
  }
}

LayerFormats dft_formats(const LayerRequest& r) {
  LayerFormats f;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const bool data = i == 0 || (r.node.op == "STFT" && i == 2);
    f.inputs.push_back(data && r.given(i) ? Format{r.input_dtypes[i], Layout::kLinear} : Format{});
  }
  f.outputs.push_back(Format{r.output_dtypes[0], Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> create_dft(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  DftGeom g;
  if (std::string why = dft_geometry(r, g); !why.empty()) throw r.node.error(ErrorKind::kUnsupported, why);
  if (g.outputs == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  const bool wide = f.inputs[0].dtype == DType::kFloat64;
  return make_layer("kernel:dft-direct", [g, wide](const LayerIO& io, cudaStream_t stream) {
    if (wide)
      dft_kernel<double><<<grid_for(g.outputs, 128), 128, 0, stream>>>(static_cast<const double*>(io.inputs[0]),
                                                                       static_cast<double*>(io.outputs[0]), g);
    else
      dft_kernel<float><<<grid_for(g.outputs, 128), 128, 0, stream>>>(static_cast<const float*>(io.inputs[0]),
                                                                      static_cast<float*>(io.outputs[0]), g);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

std::unique_ptr<Layer> create_stft(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  StftGeom g;
  if (std::string why = stft_geometry(r, g); !why.empty()) throw r.node.error(ErrorKind::kUnsupported, why);
  if (g.outputs == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  const bool wide = f.inputs[0].dtype == DType::kFloat64, windowed = r.given(2);
  return make_layer("kernel:stft-direct", [g, wide, windowed](const LayerIO& io, cudaStream_t stream) {
    const void* window = windowed ? io.inputs[2] : nullptr;
    if (wide)
      stft_kernel<double><<<grid_for(g.outputs, 128), 128, 0, stream>>>(
          static_cast<const double*>(io.inputs[0]), static_cast<const double*>(window), static_cast<double*>(io.outputs[0]), g);
    else
      stft_kernel<float><<<grid_for(g.outputs, 128), 128, 0, stream>>>(
          static_cast<const float*>(io.inputs[0]), static_cast<const float*>(window), static_cast<float*>(io.outputs[0]), g);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(dft) {
  LayerEntry e;
  e.op = "DFT";
  e.check = [](const LayerRequest& r) { return checked<DftGeom>(r, dft_geometry); };
  e.formats = dft_formats;
  e.create = create_dft;
  e.dtypes = "float32 (kept float32 under fp16), float64; constant dft_length and axis";
  registry.add(std::move(e));
  LayerEntry s;
  s.op = "STFT";
  s.check = [](const LayerRequest& r) { return checked<StftGeom>(r, stft_geometry); };
  s.formats = dft_formats;
  s.create = create_stft;
  s.dtypes = "float32 (kept float32 under fp16), float64; constant frame_step and frame_length";
  registry.add(std::move(s));
}

}  // namespace kiln::cuda
