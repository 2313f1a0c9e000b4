// CUDA layer of Det (float32, float64; float32 kept float32 under fp16): the CPU kernel's
// Gaussian elimination with partial pivoting in double (src/cpu/det.cc), one thread per matrix,
// the matrix copied into the workspace. Meant for the small matrices models take determinants
// of; matrices above 64 x 64 are left to the CPU engine.
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

constexpr int64_t kMaxOrder = 64;

template <class T>
__global__ void det_kernel(const T* __restrict__ x, T* __restrict__ y, double* __restrict__ work, int64_t matrices, int64_t n) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t m = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; m < matrices; m += step) {
    double* a = work + m * n * n;
    for (int64_t k = 0; k < n * n; ++k) a[k] = static_cast<double>(x[m * n * n + k]);
    double det = 1.0;
    for (int64_t c = 0; c < n; ++c) {
      int64_t pivot = c;
      for (int64_t r = c + 1; r < n; ++r)
        if (fabs(a[r * n + c]) > fabs(a[pivot * n + c])) pivot = r;
      const double p = a[pivot * n + c];
      if (p == 0.0) {
        det = 0.0;
        break;
      }
      if (pivot != c) {
        for (int64_t k = 0; k < n; ++k) {
          const double t = a[pivot * n + k];
          a[pivot * n + k] = a[c * n + k];
          a[c * n + k] = t;
        }
        det = -det;
      }
      det *= p;
      for (int64_t r = c + 1; r < n; ++r) {
        const double f = a[r * n + c] / p;
        for (int64_t k = c; k < n; ++k) a[r * n + k] = __dadd_rn(a[r * n + k], -__dmul_rn(f, a[c * n + k]));  // as -= f * a
      }
    }
    y[m] = static_cast<T>(det);
  }
}

std::string check_det(const LayerRequest& r) {
  const DType d = r.input_dtypes[0];
  if (d != DType::kFloat32 && d != DType::kFloat64) return "input type " + to_string(d) + " is not supported (supported: float32, float64)";
  const std::vector<int64_t>& s = r.input_shape(0);
  if (s.size() < 2 || s[s.size() - 1] != s[s.size() - 2]) return "the input must be square matrices [..., n, n]";
  if (s.back() > kMaxOrder) return "matrices above " + std::to_string(kMaxOrder) + " x " + std::to_string(kMaxOrder);
  return "";
}

LayerFormats det_formats(const LayerRequest& r) {
  LayerFormats f;
  f.inputs = {Format{r.input_dtypes[0], Layout::kLinear}};
  f.outputs.push_back(Format{r.output_dtypes[0], Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> create_det(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  const std::vector<int64_t>& s = r.input_shape(0);
  const int64_t n = s.back(), matrices = shape_numel(r.output_shapes[0]);
  if (matrices == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  const bool wide = f.inputs[0].dtype == DType::kFloat64;
  return make_layer("kernel:det", [n, matrices, wide](const LayerIO& io, cudaStream_t stream) {
    auto* work = static_cast<double*>(io.workspace);
    if (wide)
      det_kernel<double><<<grid_for(matrices, 64), 64, 0, stream>>>(static_cast<const double*>(io.inputs[0]),
                                                                   static_cast<double*>(io.outputs[0]), work, matrices, n);
    else
      det_kernel<float><<<grid_for(matrices, 64), 64, 0, stream>>>(static_cast<const float*>(io.inputs[0]),
                                                                  static_cast<float*>(io.outputs[0]), work, matrices, n);
    KILN_CUDA_CHECK_LAUNCH();
  }, static_cast<size_t>(matrices * n * n) * sizeof(double));
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(det) {
  LayerEntry e;
  e.op = "Det";
  e.check = check_det;
  e.formats = det_formats;
  e.create = create_det;
  e.dtypes = "float32 (kept float32 under fp16), float64; matrices up to 64 x 64";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
