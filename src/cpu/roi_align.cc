// CPU kernel of RoiAlign (ops/roi_align_params.h), float32: each region's samples (positions and
// weights, the same for every channel) once, then every channel's bins from them, regions and
// channels spread over the threads.
#include <algorithm>
#include <limits>
#include <vector>

#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "ops/roi_align_params.h"

namespace kiln::cpu {

namespace {

struct BinSample {
  int64_t bin;
  ir::RoiSample sample;
};

void roi_align(const ir::Node& node, const ir::RoiAlignParams& p, const Tensor& x, const Tensor& rois,
               const Tensor& batch_indices, Tensor& y) {
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), R = rois.dim(0);
  const int64_t bins = p.output_height * p.output_width;
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  // Every region's samples first (checking its batch index and sample count), then the regions'
  // channels in parallel: each writes its own bins.
  std::vector<std::vector<BinSample>> samples(static_cast<size_t>(R));
  std::vector<int64_t> counts(static_cast<size_t>(R), 0);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t n = batch_indices.data<int64_t>()[r];
    if (n < 0 || n >= N)
      throw node.error(ErrorKind::kInvalidArgument, "batch_indices[" + std::to_string(r) + "] is " + std::to_string(n) +
                                                        ", outside X's batch of " + std::to_string(N));
    if (H == 0 || W == 0) continue;  // nothing to sample: every bin reads 0
    std::vector<BinSample>& list = samples[static_cast<size_t>(r)];
    counts[static_cast<size_t>(r)] =
        ir::roi_align_samples(rois.data<float>() + r * 4, p, H, W, [&](int64_t ph, int64_t pw, const ir::RoiSample& s) {
          list.push_back({ph * p.output_width + pw, s});
        });
    if (counts[static_cast<size_t>(r)] == 0)
      throw node.error(ErrorKind::kUnsupported, "roi " + std::to_string(r) + " needs more than " +
                                                    std::to_string(ir::kMaxRoiSamplesPerAxis) +
                                                    " samples per bin along an axis (sampling_ratio 0)");
  }
  parallel_for_each(R * C, R * C * bins > 4096, [&](int64_t rc) {
    const int64_t r = rc / C, c = rc % C;
    float* out = yp + rc * bins;
    if (H == 0 || W == 0) {
      std::fill(out, out + bins, 0.0f);
      return;
    }
    const float* plane = xp + (batch_indices.data<int64_t>()[r] * C + c) * H * W;
    const float divisor = p.max_mode ? 1.0f : float(counts[static_cast<size_t>(r)]);
    if (p.max_mode) std::fill(out, out + bins, std::numeric_limits<float>::lowest());
    else std::fill(out, out + bins, 0.0f);
    std::vector<bool> sampled(p.max_mode ? static_cast<size_t>(bins) : 0, false);
    for (const BinSample& b : samples[static_cast<size_t>(r)]) {
      const ir::RoiSample& s = b.sample;
      if (p.max_mode) {
        const float v = std::max({s.weight[0] * plane[s.offset[0]], s.weight[1] * plane[s.offset[1]],
                                  s.weight[2] * plane[s.offset[2]], s.weight[3] * plane[s.offset[3]]});
        out[b.bin] = std::max(out[b.bin], v);
        sampled[static_cast<size_t>(b.bin)] = true;
      } else {
        out[b.bin] += s.weight[0] * plane[s.offset[0]] + s.weight[1] * plane[s.offset[1]] +
                      s.weight[2] * plane[s.offset[2]] + s.weight[3] * plane[s.offset[3]];
      }
    }
    for (int64_t i = 0; i < bins; ++i) {
      if (p.max_mode && !sampled[static_cast<size_t>(i)]) out[i] = 0.0f;  // a bin without samples reads 0
      else out[i] /= divisor;
    }
  });
}

}  // namespace

KILN_REGISTER_CPU_KERNELS(roi_align) {
  KernelEntry e;
  e.op = "RoiAlign";
  e.check = [](const KernelInit& init) -> std::string {
    if (init.dtype(0) != DType::kFloat32)
      return "input type " + to_string(init.dtype(0)) + " is not supported (supported: float32)";
    return "";
  };
  e.dtypes = "float32";
  e.create = [](const KernelInit& init) {
    ir::RoiAlignParams p;
    p.max_mode = init.node.attrs.get_string("mode", "avg") == "max";
    p.half_pixel = init.node.attrs.get_string("coordinate_transformation_mode", "half_pixel") == "half_pixel";
    p.output_height = init.node.attrs.get_int("output_height", 1);
    p.output_width = init.node.attrs.get_int("output_width", 1);
    p.sampling_ratio = init.node.attrs.get_int("sampling_ratio", 0);
    p.spatial_scale = init.node.attrs.get_float("spatial_scale", 1.0f);
    const ir::Node* node = &init.node;
    return make_kernel([node, p](const std::vector<const Tensor*>& in, std::vector<Tensor>& out) {
      roi_align(*node, p, *in[0], *in[1], *in[2], out[0]);
    });
  };
  registry.add(std::move(e));
}

}  // namespace kiln::cpu
