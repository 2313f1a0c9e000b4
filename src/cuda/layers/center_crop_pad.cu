// CUDA layer of CenterCropPad (any dtype, moved by element size): output element i takes input
// element i + shift along each axis (crop: shift > 0, pad: shift < 0, centred with the odd
// element at the end, as the CPU kernel and ONNX's reference take them), zero where that falls
// outside the input. The target shape must be known when building (a constant shape input).
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

struct CropPadGeom {
  int rank = 0;
  int64_t in_dims[kMaxKernelRank] = {}, out_dims[kMaxKernelRank] = {}, shift[kMaxKernelRank] = {};
  int64_t outputs = 0;
};

template <class U>
__global__ void center_crop_pad_kernel(const U* __restrict__ x, U* __restrict__ y, CropPadGeom g) {
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; o < g.outputs; o += step) {
    int64_t rem = o, off = 0, stride = 1;
    bool inside = true;
    for (int d = g.rank - 1; d >= 0; --d) {
      const int64_t i = rem % g.out_dims[d] + g.shift[d];
      rem /= g.out_dims[d];
      inside = inside && i >= 0 && i < g.in_dims[d];
      off += i * stride;
      stride *= g.in_dims[d];
    }
    y[o] = inside ? x[off] : U{};
  }
}

std::string check_center_crop_pad(const LayerRequest& r) {
  if (element_size(r.input_dtypes[0]) == 0) return to_string(r.input_dtypes[0]) + " tensors are not supported";
  if (r.input_shape(0).size() > static_cast<size_t>(kMaxKernelRank)) return "rank above " + std::to_string(kMaxKernelRank);
  // The target shape is the output's, known when building; the shape input is never read on the GPU.
  if (!r.is_constant(1)) return "shape must be a constant";
  return "";
}

LayerFormats center_crop_pad_formats(const LayerRequest& r) {
  LayerFormats f;
  f.inputs = {Format{r.storage_of(r.input_dtypes[0]), Layout::kLinear}};
  for (size_t i = 1; i < r.inputs.size(); ++i) f.inputs.emplace_back();  // the shape: read when building
  f.outputs.push_back(Format{r.storage_of(r.output_dtypes[0]), Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> create_center_crop_pad(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  const std::vector<int64_t>& in = r.input_shape(0);
  const std::vector<int64_t>& out = r.output_shapes[0];
  if (out.size() != in.size()) throw r.node.error(ErrorKind::kInternal, "the output's rank differs from the input's");
  CropPadGeom g;
  g.rank = static_cast<int>(in.size());
  for (size_t d = 0; d < in.size(); ++d) {
    g.in_dims[d] = in[d], g.out_dims[d] = out[d];
    g.shift[d] = out[d] < in[d] ? (in[d] - out[d]) / 2 : -((out[d] - in[d]) / 2);
  }
  g.outputs = shape_numel(out);
  if (g.outputs == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  const size_t es = element_size(f.inputs[0].dtype);
  return make_layer("kernel:center-crop-pad", [g, es](const LayerIO& io, cudaStream_t stream) {
    with_unit(es, [&](auto tag) {
      using U = decltype(tag);
      center_crop_pad_kernel<U><<<grid_for(g.outputs), 256, 0, stream>>>(static_cast<const U*>(io.inputs[0]),
                                                                         static_cast<U*>(io.outputs[0]), g);
      KILN_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(center_crop_pad) {
  LayerEntry e;
  e.op = "CenterCropPad";
  e.check = check_center_crop_pad;
  e.formats = center_crop_pad_formats;
  e.create = create_center_crop_pad;
  e.dtypes = "all (float32 as float16 under fp16); constant shape";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
