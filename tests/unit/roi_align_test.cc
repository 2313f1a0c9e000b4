// RoiAlign on the CPU engine: against its definition (ONNX's bilinear samples, averaged), and
// the channels-last walk that AVX-512 CPUs take for many regions against the channel-by-channel
// walk, bit for bit (src/cpu/roi_align.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "cpu/engine.h"
#include "cpu/sgemm.h"
#include "graph_builder.h"

namespace kiln {
namespace {

using testing::GraphBuilder;

struct Case {
  int64_t n, c, h, w, regions, out_h, out_w, sampling_ratio;
  float scale;
  std::string mode, transform;
};

ir::Graph roi_align_graph(const Case& k) {
  GraphBuilder b;
  b.input("x", {k.n, k.c, k.h, k.w});
  b.input("rois", {k.regions, 4});
  b.input("batch", {k.regions}, DType::kInt64);
  b.node("RoiAlign", {"x", "rois", "batch"}, "y",
         {{"output_height", k.out_h}, {"output_width", k.out_w}, {"sampling_ratio", k.sampling_ratio},
          {"spatial_scale", k.scale}, {"mode", k.mode}, {"coordinate_transformation_mode", k.transform}});
  b.output("y");
  return b.build();
}

std::map<std::string, Tensor> inputs(const Case& k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> value(0.f, 1.f);
  Tensor x(DType::kFloat32, {k.n, k.c, k.h, k.w});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = value(rng);
  // Corners in X's pixels / scale, some past the edges (samples there read 0 or the clamped edge).
  std::uniform_real_distribution<float> corner(-3.f, static_cast<float>(std::max(k.h, k.w)) + 3.f);
  Tensor rois(DType::kFloat32, {k.regions, 4});
  Tensor batch(DType::kInt64, {k.regions});
  for (int64_t r = 0; r < k.regions; ++r) {
    float x1 = corner(rng), y1 = corner(rng), x2 = corner(rng), y2 = corner(rng);
    float* roi = rois.data<float>() + r * 4;
    roi[0] = std::min(x1, x2) / k.scale;
    roi[1] = std::min(y1, y2) / k.scale;
    roi[2] = std::max(x1, x2) / k.scale;
    roi[3] = std::max(y1, y2) / k.scale;
    batch.data<int64_t>()[r] = static_cast<int64_t>(rng() % static_cast<uint32_t>(k.n));
  }
  return {{"x", x}, {"rois", rois}, {"batch", batch}};
}

// ONNX's RoiAlign, average mode, a fixed sampling ratio: each bin the mean of its sr x sr
// bilinear samples, a sample outside [-1, size] reading 0.
std::vector<double> reference(const Case& k, const std::map<std::string, Tensor>& in) {
  const float* x = in.at("x").data<float>();
  const float* rois = in.at("rois").data<float>();
  const int64_t* batch = in.at("batch").data<int64_t>();
  const double offset = k.transform == "half_pixel" ? 0.5 : 0.0;
  std::vector<double> y;
  for (int64_t r = 0; r < k.regions; ++r) {
    const double x0 = rois[r * 4] * k.scale - offset, y0 = rois[r * 4 + 1] * k.scale - offset;
    double rw = rois[r * 4 + 2] * k.scale - offset - x0, rh = rois[r * 4 + 3] * k.scale - offset - y0;
    if (k.transform != "half_pixel") {
      rw = std::max(rw, 1.0);
      rh = std::max(rh, 1.0);
    }
    const double bh = rh / k.out_h, bw = rw / k.out_w;
    for (int64_t c = 0; c < k.c; ++c) {
      const float* plane = x + (batch[r] * k.c + c) * k.h * k.w;
      auto at = [&](int64_t yy, int64_t xx) { return static_cast<double>(plane[yy * k.w + xx]); };
      for (int64_t ph = 0; ph < k.out_h; ++ph)
        for (int64_t pw = 0; pw < k.out_w; ++pw) {
          double sum = 0;
          for (int64_t iy = 0; iy < k.sampling_ratio; ++iy)
            for (int64_t ix = 0; ix < k.sampling_ratio; ++ix) {
              double sy = y0 + ph * bh + (iy + 0.5) * bh / k.sampling_ratio;
              double sx = x0 + pw * bw + (ix + 0.5) * bw / k.sampling_ratio;
              if (sy < -1 || sy > k.h || sx < -1 || sx > k.w) continue;
              sy = std::max(sy, 0.0);
              sx = std::max(sx, 0.0);
              int64_t ylo = static_cast<int64_t>(sy), xlo = static_cast<int64_t>(sx), yhi = ylo + 1, xhi = xlo + 1;
              if (ylo >= k.h - 1) yhi = ylo = k.h - 1, sy = static_cast<double>(ylo);
              if (xlo >= k.w - 1) xhi = xlo = k.w - 1, sx = static_cast<double>(xlo);
              const double ly = sy - ylo, lx = sx - xlo;
              sum += (1 - ly) * (1 - lx) * at(ylo, xlo) + (1 - ly) * lx * at(ylo, xhi) + ly * (1 - lx) * at(yhi, xlo) +
                     ly * lx * at(yhi, xhi);
            }
          y.push_back(sum / static_cast<double>(k.sampling_ratio * k.sampling_ratio));
        }
    }
  }
  return y;
}

Tensor run(const Case& k, const std::map<std::string, Tensor>& in) {
  cpu::CpuEngine engine(roi_align_graph(k));
  return engine.run(in).at("y");
}

struct IsaScope {
  explicit IsaScope(cpu::SgemmIsa isa) { cpu::sgemm_force_isa(isa); }
  ~IsaScope() { cpu::sgemm_reset_isa(); }
};

const std::vector<Case> kCases = {
    // Many regions on a small map (a box head's pooling): AVX-512 takes the channels-last walk.
    {2, 40, 9, 11, 30, 3, 4, 2, 0.5f, "avg", "half_pixel"},
    {1, 16, 6, 6, 50, 7, 7, 2, 0.25f, "avg", "output_half_pixel"},
    {1, 21, 5, 8, 12, 2, 2, 3, 1.0f, "avg", "half_pixel"},
    // One region on a larger map: the channel-by-channel walk on every CPU.
    {1, 24, 40, 40, 1, 2, 2, 1, 1.0f, "avg", "half_pixel"},
};

TEST(RoiAlign, AveragesMatchTheDefinitionOnEveryIsa) {
  for (cpu::SgemmIsa isa : {cpu::SgemmIsa::kPlain, cpu::sgemm_best_isa()}) {
    IsaScope scope(isa);
    uint32_t seed = 11;
    for (const Case& k : kCases) {
      SCOPED_TRACE(std::string(cpu::sgemm_isa_name(isa)) + " C " + std::to_string(k.c) + " regions " +
                   std::to_string(k.regions) + " " + k.transform);
      const std::map<std::string, Tensor> in = inputs(k, seed++);
      const Tensor got = run(k, in);
      const std::vector<double> want = reference(k, in);
      ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got.data<float>()[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << "element " << i;
    }
  }
}

TEST(RoiAlign, ChannelsLastWalkGivesTheSameBitsAsTheChannelWalk) {
  if (cpu::sgemm_best_isa() != cpu::SgemmIsa::kAvx512)
    GTEST_SKIP() << "the channels-last walk runs on AVX-512 CPUs only; the test above checks the other walk";
  uint32_t seed = 40;
  for (Case k : kCases)
    for (const char* mode : {"avg", "max"}) {
      k.mode = mode;
      SCOPED_TRACE(std::string(mode) + " C " + std::to_string(k.c) + " regions " + std::to_string(k.regions));
      std::map<std::string, Tensor> in = inputs(k, seed++);
      in.at("x").data<float>()[3] = NAN;  // a NaN sample: both walks keep or drop it alike
      Tensor plain, wide;
      {
        IsaScope scope(cpu::SgemmIsa::kPlain);
        plain = run(k, in);
      }
      {
        IsaScope scope(cpu::SgemmIsa::kAvx512);
        wide = run(k, in);
      }
      ASSERT_EQ(plain.numel(), wide.numel());
      for (int64_t i = 0; i < plain.numel(); ++i) {
        const float a = plain.data<float>()[i], b = wide.data<float>()[i];
        ASSERT_TRUE((std::isnan(a) && std::isnan(b)) || a == b) << "element " << i << ": " << a << " vs " << b;
      }
    }
}

}  // namespace
}  // namespace kiln
