// The CPU epilogue's vector activations (cpu/gemm_util.h, activation_block), 16-wide and
// 8-wide, against ir::Activation::apply, the scalar formula every other path uses: ordinary
// values, the ends of e^x's range, where exp overflows and flushes, signed zeros, infinities and
// NaN, and every length of a vector tail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpu/gemm_util.h"
#include "cpu/sgemm.h"
#include "ir/activation.h"

namespace kiln {
namespace {

// Distance in units in the last place between two finite floats of the same sign.
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

TEST(ActivationVectors, MatchTheScalarFormula) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> values = {-1e30f, -200.f, -89.f, -88.5f, -87.5f, -87.f, -86.9f, -30.f, -10.f, -3.f, -2.9f,
                               -1.f, -1e-3f, -1e-30f, -0.f, 0.f, 1e-30f, 1e-3f, 0.5f, 1.f, 2.9f, 3.f, 10.f,
                               30.f, 86.9f, 87.f, 88.2f, 88.4f, 89.f, 200.f, 1e30f, inf, -inf, nan};
  for (int i = -400; i <= 400; ++i) values.push_back(static_cast<float>(i) * 0.0731f);
  for (cpu::SgemmIsa isa : {cpu::SgemmIsa::kAvx2, cpu::SgemmIsa::kAvx512})
  for (const char* name : {"Sigmoid", "SiLU", "HardSwish", "HardSigmoid"}) {
    if (cpu::sgemm_best_isa() < isa) continue;  // a CPU without AVX-512 runs the 8-wide forms only
    SCOPED_TRACE(std::string(name) + " on " + cpu::sgemm_isa_name(isa));
    cpu::sgemm_force_isa(isa);
    const ir::Activation act = ir::Activation::named(name, 0.2f, 0.5f);
    std::vector<float> got = values;
    cpu::activation_block(act, got.data(), static_cast<int64_t>(got.size()), 1, static_cast<int64_t>(got.size()));
    for (size_t i = 0; i < values.size(); ++i) {
      const float want = act.apply(values[i]);
      SCOPED_TRACE("x = " + std::to_string(values[i]));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[i])) << got[i];
      } else if (std::isinf(want)) {
        EXPECT_EQ(got[i], want);
      } else if (want == 0.f || std::fabs(want) < 1e-30f) {
        EXPECT_NEAR(got[i], want, 1e-30f);
      } else {
        EXPECT_LE(ulps(got[i], want), 8) << got[i] << " against " << want;
      }
    }
    // Every tail length gives each element the same value as a whole vector does.
    for (int64_t n = 1; n <= 17; ++n) {
      std::vector<float> part(values.begin() + 3, values.begin() + 3 + n);
      cpu::activation_block(act, part.data(), n, 1, n);
      for (int64_t i = 0; i < n; ++i)
        if (!std::isnan(got[static_cast<size_t>(3 + i)]))
          EXPECT_EQ(part[static_cast<size_t>(i)], got[static_cast<size_t>(3 + i)]) << "length " << n << " element " << i;
    }
    cpu::sgemm_reset_isa();
  }
}

TEST(ActivationVectors, HardSwishGivesTheScalarFormulasBits) {
  // The vector forms divide by 6 as a multiply-add of two parts of 1/6 (exhaustively the same
  // HardSwish for every float, gemm_util.cc): here every 251st bit pattern, and the patterns
  // around zero, one, six, the largest float and infinity, under each instruction set.
  std::vector<float> values;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 251) {
    float v;
    const uint32_t b = static_cast<uint32_t>(bits);
    std::memcpy(&v, &b, 4);
    values.push_back(v);
  }
  for (float edge : {0.f, 1.f, 3.f, 6.f, std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                     std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min()})
    for (float sign : {1.f, -1.f}) {
      float v = sign * edge;
      for (int k = 0; k < 64; ++k, v = std::nextafter(v, sign * std::numeric_limits<float>::infinity())) values.push_back(v);
    }
  const ir::Activation act = ir::Activation::named("HardSwish", 0.f, 0.f);
  for (cpu::SgemmIsa isa : {cpu::SgemmIsa::kAvx2, cpu::SgemmIsa::kAvx512}) {
    if (cpu::sgemm_best_isa() < isa) continue;
    SCOPED_TRACE(cpu::sgemm_isa_name(isa));
    cpu::sgemm_force_isa(isa);
    std::vector<float> got = values;
    cpu::activation_block(act, got.data(), static_cast<int64_t>(got.size()), 1, static_cast<int64_t>(got.size()));
    cpu::sgemm_reset_isa();
    int64_t differ = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      const float want = act.apply(values[i]);
      const bool same = std::isnan(want) ? std::isnan(got[i]) : std::memcmp(&want, &got[i], 4) == 0;
      if (!same && differ++ < 5) ADD_FAILURE() << "x = " << values[i] << ": " << got[i] << " against " << want;
    }
    EXPECT_EQ(differ, 0);
  }
}

}  // namespace
}  // namespace kiln
