// The CPU engine's Attention kernel (src/cpu/attention.cc) against softmax(Q K^T scale + mask) V
// computed in double: key counts below, at and above the kernel's vector widths (8 keys for
// the softmax, 32 and 64 for the logits), an additive mask with -inf entries, causal rows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "compute_test_util.h"
#include "cpu/engine.h"

namespace kiln {
namespace {

using testing::random_tensor;

TEST(AttentionKernel, MatchesSoftmaxInDouble) {
  const double inf = std::numeric_limits<double>::infinity();
  uint32_t seed = 40;
  for (int64_t T : {7, 19, 70, 130})
    for (bool causal : {false, true}) {
      const int64_t B = 2, H = 3, S = causal ? T : 5, D = 16, Dv = 8;
      SCOPED_TRACE("keys " + std::to_string(T) + (causal ? " causal" : " with a mask"));
      Tensor q = random_tensor({B, H, S, D}, seed++), k = random_tensor({B, H, T, D}, seed++),
             v = random_tensor({B, H, T, Dv}, seed++), mask = random_tensor({S, T}, seed++);
      // Scale the logits up so the softmax is far from uniform, and mask every third key of
      // each row but its first.
      for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] *= 3.f;
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 1; j < T; j += 3) mask.data<float>()[i * T + j] = -std::numeric_limits<float>::infinity();
      ir::Node node;
      if (causal) node.attrs.set("is_causal", int64_t{1});
      cpu::CpuEngine engine(testing::attention_graph({{"Q", &q}, {"K", &k}, {"V", &v}, {"M", &mask}}, node));
      const Tensor y = engine.run({{"Q", q}, {"K", k}, {"V", v}, {"M", mask}}).at("Y");
      ASSERT_EQ(y.shape(), (std::vector<int64_t>{B, H, S, Dv}));
      const double scale = 1.0 / std::sqrt(static_cast<double>(D));
      double worst = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < S; ++i) {
            std::vector<double> logit(static_cast<size_t>(T));
            double largest = -inf;
            for (int64_t j = 0; j < T; ++j) {
              double dot = 0;
              for (int64_t d = 0; d < D; ++d)
                dot += double(q.data<float>()[((b * H + h) * S + i) * D + d]) * k.data<float>()[((b * H + h) * T + j) * D + d];
              logit[j] = dot * scale + mask.data<float>()[i * T + j] + (causal && j > i ? -inf : 0.0);
              largest = std::max(largest, logit[j]);
            }
            double sum = 0;
            for (double& l : logit) sum += (l = std::exp(l - largest));
            for (int64_t d = 0; d < Dv; ++d) {
              double want = 0;
              for (int64_t j = 0; j < T; ++j) want += logit[j] / sum * v.data<float>()[((b * H + h) * T + j) * Dv + d];
              const double got = y.data<float>()[((b * H + h) * S + i) * Dv + d];
              worst = std::max(worst, std::abs(got - want));
              ASSERT_NEAR(got, want, 2e-6) << "b " << b << " h " << h << " query " << i << " column " << d;
            }
          }
      EXPECT_LT(worst, 2e-6);
    }
}

}  // namespace
}  // namespace kiln
