// CUDA layer of RotaryEmbedding (float32), as the CPU kernel (src/cpu/rotary_embedding.cc) and
// ONNX's reference define it: the first `rot` features of each head rotated pairwise by the
// position's cos and sin, the pairs being (i, i + rot / 2), or (2i, 2i + 1) when interleaved; the
// other features copied. One thread per output element. A position id outside the caches' rows
// is an error on the CPU; here the kernel raises the layer's run flag (make_checked_layer) and
// run() throws it.
#include <string>

#include "cuda/kernels/common.cuh"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

struct RotaryGeom {
  int64_t batch = 0, seq = 0, heads = 0, head = 0, rot = 0, half = 0, cache_rows = 0;
  bool four_d = false, interleaved = false, positions = false;
};

__global__ void rotary_kernel(const float* __restrict__ x, const float* __restrict__ cos_cache,
                              const float* __restrict__ sin_cache, const int64_t* __restrict__ position_ids,
                              float* __restrict__ y, RotaryGeom g, int* __restrict__ out_of_range) {
  const int64_t n = g.batch * g.seq * g.heads * g.head;
  for (int64_t o = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; o < n; o += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = o % g.head, row = o / g.head;
    // The element's batch and position: rows are [b, s, h] (3-D input) or [b, h, s] (4-D).
    int64_t b, s;
    if (g.four_d) {
      s = row % g.seq;
      b = row / (g.seq * g.heads);
    } else {
      s = (row / g.heads) % g.seq;
      b = row / (g.heads * g.seq);
    }
    if (j >= g.rot) {
      y[o] = x[o];
      continue;
    }
    int64_t cache_row = b * g.seq + s;
    if (g.positions) {
      cache_row = position_ids[b * g.seq + s];
      if (cache_row < 0 || cache_row >= g.cache_rows) {
        *out_of_range = 1;
        y[o] = 0.f;
        continue;
      }
    }
    const int64_t i = g.interleaved ? j / 2 : (j < g.half ? j : j - g.half);
    const bool first = g.interleaved ? (j % 2 == 0) : j < g.half;
    const int64_t partner = g.interleaved ? (first ? j + 1 : j - 1) : (first ? j + g.half : j - g.half);
    const float c = cos_cache[cache_row * g.half + i], sn = sin_cache[cache_row * g.half + i];
    const float self = x[o], other = x[o - j + partner];
    y[o] = first ? c * self - sn * other : sn * other + c * self;
  }
}

// The geometry of a request, or why the layer cannot take it.
std::string rotary_geom(const LayerRequest& r, RotaryGeom& g) {
  const std::vector<int64_t>& x = r.input_shape(0);
  const std::vector<int64_t>& cos = r.input_shape(1);
  g.positions = r.has_input(3);
  if ((x.size() != 3 && x.size() != 4) || cos.size() != (g.positions ? 2u : 3u) || r.input_shape(2) != cos)
    return std::string("the input must have rank 3 or 4, the caches one shape of rank ") + (g.positions ? "2" : "3");
  g.four_d = x.size() == 4;
  g.batch = x[0];
  g.seq = g.four_d ? x[2] : x[1];
  g.heads = g.four_d ? x[1] : r.node.attrs.get_int("num_heads", 0);
  if (g.heads <= 0 || (!g.four_d && x[2] % g.heads != 0)) return "the hidden size does not split into num_heads heads";
  g.head = g.four_d ? x[3] : x[2] / g.heads;
  g.rot = r.node.attrs.get_int("rotary_embedding_dim", 0);
  if (g.rot == 0) g.rot = g.head;
  if (g.rot < 0 || g.rot > g.head || g.rot % 2 != 0) return "rotary_embedding_dim must be even and at most the head size";
  g.half = g.rot / 2;
  if (cos.back() != g.half) return "the caches' last dim must be rotary_embedding_dim / 2";
  if (g.positions) {
    if (r.input_shape(3) != std::vector<int64_t>{g.batch, g.seq}) return "position_ids must be [batch, seq]";
  } else if (cos[0] != g.batch || cos[1] != g.seq) {
    return "without position_ids the caches must be [batch, seq, rot / 2]";
  }
  g.cache_rows = cos[0];
  g.interleaved = r.node.attrs.get_int("interleaved", 0) != 0;
  return "";
}

std::string check_rotary(const LayerRequest& r) {
  if (!r.has_input(0) || !r.has_input(1) || !r.has_input(2)) return "X, cos_cache and sin_cache are required";
  for (size_t i = 0; i < 3; ++i)
    if (r.input_dtypes[i] != DType::kFloat32) return "input type " + to_string(r.input_dtypes[i]) + " is not supported (supported: float32)";
  if (r.has_input(3) && r.input_dtypes[3] != DType::kInt64) return "position_ids must be int64";
  RotaryGeom g;
  return rotary_geom(r, g);
}

LayerFormats rotary_formats(const LayerRequest& r) {
  LayerFormats f;
  for (size_t i = 0; i < r.inputs.size(); ++i)
    f.inputs.push_back(r.has_input(i) ? Format{i == 3 ? DType::kInt64 : DType::kFloat32, Layout::kLinear} : Format{});
  f.outputs.push_back(Format{DType::kFloat32, Layout::kLinear});
  return f;
}

}  // namespace

KILN_REGISTER_CUDA_LAYERS(rotary_embedding) {
  LayerEntry e;
  e.op = "RotaryEmbedding";
  e.check = check_rotary;
  e.formats = rotary_formats;
  e.create = [](const LayerRequest& r, const LayerFormats&, BuildServices&) -> std::unique_ptr<Layer> {
    RotaryGeom g;
    const std::string why = rotary_geom(r, g);
    if (!why.empty()) throw r.node.error(ErrorKind::kUnsupported, why);
    const int64_t n = g.batch * g.seq * g.heads * g.head;
    return make_checked_layer(
        "kernel:rotary",
        [g, n](const LayerIO& io, cudaStream_t stream, int* out_of_range) {
          if (n <= 0) return;
          rotary_kernel<<<grid_for(n), 256, 0, stream>>>(
              static_cast<const float*>(io.inputs[0]), static_cast<const float*>(io.inputs[1]),
              static_cast<const float*>(io.inputs[2]), g.positions ? static_cast<const int64_t*>(io.inputs[3]) : nullptr,
              static_cast<float*>(io.outputs[0]), g, out_of_range);
          KILN_CUDA_CHECK_LAUNCH();
        },
        "RotaryEmbedding: a position id is outside the caches' " + std::to_string(g.cache_rows) + " rows");
  };
  e.dtypes = "float32";
  registry.add(std::move(e));
}

}  // namespace kiln::cuda
