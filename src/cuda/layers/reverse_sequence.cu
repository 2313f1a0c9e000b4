// CUDA layer of ReverseSequence (any dtype, moved as units of up to 16 bytes): each batch entry's
// first sequence_lens[b] steps along the time axis in reverse order, the rest as they are.
// sequence_lens is read on the device; a length outside [0, time] (which the CPU kernel refuses
// with an error) leaves its entry's output 0 and raises the layer's RunFlag, and run() throws.
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

// x viewed as [time, batch, inner] (or [batch, time, inner] when batch_first), inner in units.
template <class U>
__global__ void reverse_sequence_kernel(const U* __restrict__ x, const int64_t* __restrict__ lens, U* __restrict__ y,
                                        int64_t batch, int64_t time, int64_t inner, bool batch_first,
                                        int* __restrict__ refused) {
  const int64_t total = batch * time * inner, step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t u = i % inner, row = i / inner;
    const int64_t b = batch_first ? row / time : row % batch, t = batch_first ? row % time : row / batch;
    const int64_t len = lens[b];
    if (len < 0 || len > time) {
      *refused = 1;
      y[i] = U{};
      continue;
    }
    const int64_t from = t < len ? len - 1 - t : t;
    y[i] = x[(batch_first ? b * time + from : from * batch + b) * inner + u];
  }
}

std::string check_reverse_sequence(const LayerRequest& r) {
  if (element_size(r.input_dtypes[0]) == 0) return to_string(r.input_dtypes[0]) + " tensors are not supported";
  if (r.input_dtypes[1] != DType::kInt64) return "sequence_lens must be int64, is " + to_string(r.input_dtypes[1]);
  if (r.input_shape(0).size() < 2) return "the input must have rank >= 2";
  return "";
}

LayerFormats reverse_sequence_formats(const LayerRequest& r) {
  LayerFormats f;
  f.inputs = {Format{r.storage_of(r.input_dtypes[0]), Layout::kLinear}, Format{DType::kInt64, Layout::kLinear}};
  f.outputs.push_back(Format{r.storage_of(r.output_dtypes[0]), Layout::kLinear});
  return f;
}

std::unique_ptr<Layer> create_reverse_sequence(const LayerRequest& r, const LayerFormats& f, BuildServices&) {
  const std::vector<int64_t>& s = r.input_shape(0);
  const bool batch_first = r.node.attrs.get_int("batch_axis", 1) == 0;
  const int64_t batch = s[batch_first ? 0 : 1], time = s[batch_first ? 1 : 0];
  int64_t inner = 1;
  for (size_t d = 2; d < s.size(); ++d) inner *= s[d];
  if (batch * time * inner == 0) return make_layer("kernel:none", [](const LayerIO&, cudaStream_t) {});
  const size_t es = element_size(f.inputs[0].dtype);
  const size_t max_unit = widest_unit(es, {static_cast<uint64_t>(inner) * es});
  return make_checked_layer("kernel:reverse-sequence", [=](const LayerIO& io, cudaStream_t stream, int* refused) {
    const size_t unit = std::max(es, pointer_unit(max_unit, io.inputs[0], io.outputs[0]));
    const int64_t units = inner * static_cast<int64_t>(es) / static_cast<int64_t>(unit);
    with_unit(unit, [&](auto tag) {
      using U = decltype(tag);
      reverse_sequence_kernel<U><<<grid_for(batch * time * units), 256, 0, stream>>>(
          static_cast<const U*>(io.inputs[0]), static_cast<const int64_t*>(io.inputs[1]), static_cast<U*>(io.outputs[0]),
          batch, time, units, batch_first, refused);
      KILN_CUDA_CHECK_LAUNCH();
    });
  }, "ReverseSequence '" + r.node.name + "': a sequence_lens value is outside [0, " + std::to_string(time) + "]");
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(reverse_sequence) {
  LayerEntry e;
  e.op = "ReverseSequence";
  e.check = check_reverse_sequence;
  e.formats = reverse_sequence_formats;
  e.create = create_reverse_sequence;
  e.dtypes = "all (float32 as float16 under fp16)";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
