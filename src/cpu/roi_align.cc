// CPU kernel of RoiAlign (ops/roi_align_params.h), float32: each region's samples (positions and
// weights, the same for every channel) once, then every channel's bins from them, regions and
// channels spread over the threads. With AVX-512 and many samples for the size of X, X is first
// transposed to channels last, and each sample then reads 16 channels with one load per corner
// (roi_align_channels_last): a detection model's box head pools hundreds of regions from small
// feature maps, where the channel-by-channel walk spent 20 of Faster R-CNN MobileNet's 100 ms on
// the CPU engine. Both walks do the same float operations in the same order (per lane), so they
// give the same bits.
#include <immintrin.h>

#include <algorithm>
#include <limits>
#include <set>
#include <vector>

#include "cpu/aligned_vector.h"
#include "cpu/gemm_util.h"
#include "cpu/kernel.h"
#include "cpu/parallel.h"
#include "cpu/sgemm.h"
#include "ops/roi_align_params.h"

namespace kiln::cpu {

namespace {

struct BinSample {
  int64_t bin;
  ir::RoiSample sample;
};

// Whether transposing X to channels last (H * W * C floats, once per batch index read) costs less
// than it saves: the channel-by-channel walk makes about 8 scalar loads and 4 products a sample
// and channel, the channels-last one a sixteenth of that.
bool channels_last_pays(int64_t channels, int64_t plane, const std::vector<std::vector<BinSample>>& samples) {
  if (sgemm_isa() != SgemmIsa::kAvx512 || channels < 8 || plane == 0) return false;
  int64_t taken = 0;
  for (const std::vector<BinSample>& list : samples) taken += static_cast<int64_t>(list.size());
  return taken * 4 > plane;
}

// std::max(a, b) lane by lane: b where a < b, else a (so a NaN in b is not taken).
__attribute__((target("avx512f"))) inline __m512 larger16(__m512 a, __m512 b) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), a, b);
}

// `acc` = the lanes' running values, `v` = a sample's: avg adds, max keeps the larger as
// std::max does (a NaN in `v` is not taken, one already in `acc` stays).
__attribute__((target("avx512f"))) inline __m512 sample16(const ir::RoiSample& s, const float* at, __mmask16 lanes,
                                                         int64_t C, bool max_mode) {
  const __m512 p0 = _mm512_maskz_loadu_ps(lanes, at + s.offset[0] * C), p1 = _mm512_maskz_loadu_ps(lanes, at + s.offset[1] * C);
  const __m512 p2 = _mm512_maskz_loadu_ps(lanes, at + s.offset[2] * C), p3 = _mm512_maskz_loadu_ps(lanes, at + s.offset[3] * C);
  const __m512 t0 = _mm512_mul_ps(_mm512_set1_ps(s.weight[0]), p0), t1 = _mm512_mul_ps(_mm512_set1_ps(s.weight[1]), p1);
  const __m512 t2 = _mm512_mul_ps(_mm512_set1_ps(s.weight[2]), p2), t3 = _mm512_mul_ps(_mm512_set1_ps(s.weight[3]), p3);
  if (!max_mode) return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(t0, t1), t2), t3);  // as the scalar a + b + c + d
  return larger16(larger16(larger16(t0, t1), t2), t3);
}

// One region's bins for 16 channels (`lanes_used` of them) from channels-last X (`at`: the
// region's image, at its first channel): bins x 16 running values, then y[channel][bin].
__attribute__((target("avx512f"))) void pool_region16(const ir::RoiAlignParams& p, const std::vector<BinSample>& samples,
                                                     int64_t count, const float* at, int lanes_used, int64_t C,
                                                     int64_t bins, float* y) {
  const __mmask16 lanes = static_cast<__mmask16>((1u << lanes_used) - 1);
  thread_local AlignedVector<float> acc;  // 16 floats a bin, a vector each
  acc.assign(static_cast<size_t>(bins * 16), p.max_mode ? std::numeric_limits<float>::lowest() : 0.0f);
  thread_local std::vector<char> sampled;
  sampled.assign(static_cast<size_t>(bins), 0);
  for (const BinSample& b : samples) {
    float* out = acc.data() + b.bin * 16;
    const __m512 v = sample16(b.sample, at, lanes, C, p.max_mode);
    const __m512 o = _mm512_loadu_ps(out);
    _mm512_storeu_ps(out, p.max_mode ? larger16(o, v) : _mm512_add_ps(o, v));
    if (p.max_mode) sampled[static_cast<size_t>(b.bin)] = 1;
  }
  const float divisor = p.max_mode ? 1.0f : float(count);
  for (int64_t i = 0; i < bins; ++i)
    for (int c = 0; c < lanes_used; ++c) {
      const float v = acc[static_cast<size_t>(i * 16 + c)];
      y[c * bins + i] = p.max_mode ? (sampled[static_cast<size_t>(i)] ? v : 0.0f) : v / divisor;
    }
}

// The channels-last walk: X transposed once per image that a region reads, then each region's
// bins 16 channels at a time, regions and channel blocks spread over the threads.
void roi_align_channels_last(const ir::RoiAlignParams& p, const Tensor& x, const Tensor& batch_indices,
                             const std::vector<std::vector<BinSample>>& samples, const std::vector<int64_t>& counts,
                             Tensor& y) {
  const int64_t C = x.dim(1), H = x.dim(2), W = x.dim(3), R = static_cast<int64_t>(samples.size());
  const int64_t bins = p.output_height * p.output_width, plane = H * W;
  const int64_t* batch = batch_indices.data<int64_t>();
  const std::set<int64_t> images(batch, batch + R);
  std::vector<float> transposed(static_cast<size_t>(static_cast<int64_t>(images.size()) * plane * C));
  std::vector<int64_t> slot(static_cast<size_t>(x.dim(0)), -1);
  int64_t next = 0;
  for (int64_t n : images) {
    slot[static_cast<size_t>(n)] = next;
    transpose_floats(x.data<float>() + n * C * plane, C, plane, transposed.data() + next * plane * C);
    ++next;
  }
  const int64_t blocks = (C + 15) / 16;
  float* yp = y.data<float>();
  parallel_for_each(R * blocks, R * C * bins > 4096, [&](int64_t job) {
    const int64_t r = job / blocks, c0 = job % blocks * 16;
    pool_region16(p, samples[static_cast<size_t>(r)], counts[static_cast<size_t>(r)],
                  transposed.data() + slot[static_cast<size_t>(batch[r])] * plane * C + c0,
                  static_cast<int>(std::min<int64_t>(16, C - c0)), C, bins, yp + (r * C + c0) * bins);
  });
}

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
  if (channels_last_pays(C, H * W, samples)) {
    roi_align_channels_last(p, x, batch_indices, samples, counts, y);
    return;
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
