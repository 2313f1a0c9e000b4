// CUDA layer of Einsum (float32, float64, int32, int64; float32 kept float32 under fp16): one
// thread per output element sums the products over every combination of the contracted labels,
// in the CPU kernel's order (the last label fastest) and in its types (double for floats,
// rounded once at the end; products and sums rounded one at a time, not fused), so both engines
// give the same bits. Like the CPU kernel it is meant for the small contractions models write as
// Einsum: a contraction of more than 2^24 products per output element is refused here (the
// partitioned build runs it on the CPU engine), as a large one is the MatMul it spells.
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"
#include "ops/einsum_params.h"

namespace kiln::cuda {

namespace {

constexpr int kMaxEinsumOperands = 4;
constexpr int kMaxEinsumLabels = 12;
constexpr int64_t kMaxProductsPerOutput = int64_t{1} << 24;

struct EinsumGeom {
  int operands = 0;
  int out_rank = 0, contracted = 0;
  int out_label[kMaxEinsumLabels] = {};         // per output axis: its label
  int sum_label[kMaxEinsumLabels] = {};         // the contracted labels, in label order
  int64_t size[kMaxEinsumLabels] = {};          // per label
  int64_t stride[kMaxEinsumOperands][kMaxEinsumLabels] = {};  // per operand and label, in elements
  int64_t outputs = 0, products = 0;            // output elements; products per output element
};

template <class Acc> __device__ __forceinline__ Acc mul_rounded(Acc a, Acc b) {
  if constexpr (std::is_same_v<Acc, double>) return __dmul_rn(a, b);
  else return a * b;
}
template <class Acc> __device__ __forceinline__ Acc add_rounded(Acc a, Acc b) {
  if constexpr (std::is_same_v<Acc, double>) return __dadd_rn(a, b);
  else return a + b;
}

template <class T>
__global__ void einsum_kernel(EinsumGeom g, const T* __restrict__ x0, const T* __restrict__ x1, const T* __restrict__ x2,
                              const T* __restrict__ x3, T* __restrict__ y) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, T>;
  const T* const x[kMaxEinsumOperands] = {x0, x1, x2, x3};
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; o < g.outputs; o += step) {
    int64_t base[kMaxEinsumOperands] = {};  // each operand's offset at this output element
    int64_t rem = o;
    for (int a = g.out_rank - 1; a >= 0; --a) {
      const int l = g.out_label[a];
      const int64_t i = rem % g.size[l];
      rem /= g.size[l];
      for (int k = 0; k < g.operands; ++k) base[k] += i * g.stride[k][l];
    }
    int64_t index[kMaxEinsumLabels] = {};  // the contracted labels' indices (odometer)
    int64_t offset[kMaxEinsumOperands];
    for (int k = 0; k < g.operands; ++k) offset[k] = base[k];
    Acc acc = Acc(0);
    for (int64_t n = 0; n < g.products; ++n) {
      Acc product = Acc(1);
      for (int k = 0; k < g.operands; ++k) product = mul_rounded(product, static_cast<Acc>(x[k][offset[k]]));
      acc = add_rounded(acc, product);
      for (int j = g.contracted - 1; j >= 0; --j) {  // next combination, the last label fastest
        const int l = g.sum_label[j];
        for (int k = 0; k < g.operands; ++k) offset[k] += g.stride[k][l];
        if (++index[j] < g.size[l]) break;
        for (int k = 0; k < g.operands; ++k) offset[k] -= g.size[l] * g.stride[k][l];
        index[j] = 0;
      }
    }
    y[o] = static_cast<T>(acc);
  }
}

// The geometry of this node's contraction, or why the GPU layer does not take it.
std::string einsum_geometry(const LayerRequest& r, EinsumGeom& g) {
  const size_t operands = r.inputs.size();
  if (operands == 0 || operands > static_cast<size_t>(kMaxEinsumOperands))
    return std::to_string(operands) + " operands (at most " + std::to_string(kMaxEinsumOperands) + " on the GPU)";
  std::vector<int64_t> ranks;
  for (size_t i = 0; i < operands; ++i) {
    if (!r.has_input(i)) return "an operand is missing";
    ranks.push_back(static_cast<int64_t>(r.input_shape(i).size()));
  }
  ops::EinsumEquation eq;
  if (std::string why = ops::parse_einsum(r.node.attrs.get_string("equation", ""), ranks, eq); !why.empty())
    return "equation: " + why;
  if (eq.labels > kMaxEinsumLabels)
    return std::to_string(eq.labels) + " labels (at most " + std::to_string(kMaxEinsumLabels) + " on the GPU)";
  g = EinsumGeom{};
  g.operands = static_cast<int>(operands);
  for (int l = 0; l < eq.labels; ++l) g.size[l] = 1;
  for (size_t i = 0; i < operands; ++i)
    for (size_t a = 0; a < eq.inputs[i].size(); ++a)
      g.size[eq.inputs[i][a]] = std::max(g.size[eq.inputs[i][a]], r.input_shape(i)[a]);
  for (size_t i = 0; i < operands; ++i) {
    int64_t s = 1;
    const std::vector<int64_t>& shape = r.input_shape(i);
    for (size_t a = shape.size(); a-- > 0;) {
      const int l = eq.inputs[i][a];
      if (shape[a] != g.size[l] && shape[a] != 1)
        return "operand " + std::to_string(i) + "'s dim " + std::to_string(a) + " does not match its label's size";
      if (shape[a] != 1) g.stride[i][l] += s;
      s *= shape[a];
    }
  }
  std::vector<bool> in_output(static_cast<size_t>(eq.labels), false);
  g.out_rank = static_cast<int>(eq.output.size());
  g.outputs = 1;
  for (size_t a = 0; a < eq.output.size(); ++a) {
    g.out_label[a] = eq.output[a];
    in_output[static_cast<size_t>(eq.output[a])] = true;
    g.outputs *= g.size[eq.output[a]];
  }
  g.products = 1;
  for (int l = 0; l < eq.labels; ++l)
    if (!in_output[static_cast<size_t>(l)]) {
      g.sum_label[g.contracted++] = l;
      if (g.size[l] != 0 && g.products > kMaxProductsPerOutput / g.size[l])
        return "more than 2^24 products per output element (the MatMul it spells is faster; the CPU engine takes it)";
      g.products *= g.size[l];
    }
  return "";
}

bool einsum_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kInt32 || d == DType::kInt64;
}

std::string check_einsum(const LayerRequest& r) {
  for (size_t i = 0; i < r.inputs.size(); ++i)
    if (!einsum_dtype(r.input_dtypes[i]) || r.input_dtypes[i] != r.input_dtypes[0])
      return "input type " + to_string(r.input_dtypes[i]) + " is not supported (supported: float32, float64, int32, int64)";
  EinsumGeom g;
  return einsum_geometry(r, g);
}

LayerFormats einsum_formats(const LayerRequest& r) {
  LayerFormats f;
  for (size_t i = 0; i < r.inputs.size(); ++i) f.inputs.push_back(Format{r.input_dtypes[i], Layout::kLinear});
  f.outputs.push_back(Format{r.output_dtypes[0], Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> create_einsum(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  EinsumGeom g;
  if (std::string why = einsum_geometry(r, g); !why.empty()) throw r.node.error(ErrorKind::kUnsupported, why);
  if (g.outputs == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  const DType dtype = f.outputs[0].dtype;
  return make_layer("kernel:einsum-direct", [g, dtype](const LayerIO& io, cudaStream_t stream) {
    KILN_DISPATCH_ALL_TYPES(dtype, T, [&] {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int32_t> ||
                    std::is_same_v<T, int64_t>) {
        const T* x[kMaxEinsumOperands] = {};
        for (int k = 0; k < g.operands; ++k) x[k] = static_cast<const T*>(io.inputs[static_cast<size_t>(k)]);
        einsum_kernel<T><<<grid_for(g.outputs, 128), 128, 0, stream>>>(g, x[0], x[1], x[2], x[3],
                                                                       static_cast<T*>(io.outputs[0]));
        KILN_CUDA_CHECK_LAUNCH();
      } else {
        throw Error(ErrorKind::kInternal, "Einsum has no kernel for " + to_string(dtype));
      }
    });
  });
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(einsum) {
  LayerEntry e;
  e.op = "Einsum";
  e.check = check_einsum;
  e.formats = einsum_formats;
  e.create = create_einsum;
  e.dtypes = "float32 (kept float32 under fp16), float64, int32, int64";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
