// The CPU kernels' broadcasting plans (src/cpu/broadcast.h): BroadcastCursor walks consecutive
// rows with the offsets row_offsets computes for each, from any first row, over plans of one to
// four merged dims and up to three inputs, broadcasting along inner, middle and outer dims.
#include <gtest/gtest.h>

#include "cpu/broadcast.h"

namespace kiln::cpu {
namespace {

TEST(BroadcastCursor, WalksTheRowsRowOffsetsGives) {
  struct Case {
    std::vector<int64_t> out;
    std::vector<std::vector<int64_t>> inputs;
  };
  const std::vector<Case> cases = {
      {{1, 28, 28, 120}, {{1, 28, 28, 120}, {1, 1, 1, 120}}},      // channels-last times per-channel
      {{2, 5, 3, 4}, {{2, 5, 3, 4}, {2, 1, 1, 4}}},                // per image and channel
      {{2, 5, 3, 4}, {{5, 1, 4}, {2, 1, 3, 1}, {1}}},              // three inputs, every kind of axis
      {{3, 1, 7, 2, 6}, {{3, 1, 1, 2, 1}, {7, 1, 6}}},             // alternating broadcast axes
      {{4, 6}, {{4, 6}, {4, 6}}},                                  // one long row
      {{1, 1}, {{1, 1}, {1}}},                                     // every dim 1
  };
  for (const Case& c : cases) {
    std::vector<const std::vector<int64_t>*> shapes;
    for (const auto& s : c.inputs) shapes.push_back(&s);
    const BroadcastPlan plan = plan_broadcast(c.out, shapes);
    for (int64_t first = 0; first < plan.rows(); first += std::max<int64_t>(1, plan.rows() / 5)) {
      BroadcastCursor cursor(plan, first);
      for (int64_t r = first; r < plan.rows(); ++r, cursor.next()) {
        std::vector<int64_t> want(c.inputs.size());
        plan.row_offsets(r, want.data());
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(cursor.offset(i), want[i]) << "row " << r << " from " << first << ", input " << i << ", " << c.out.size()
                                               << "-d output of " << plan.rows() << " rows";
      }
    }
  }
}

}  // namespace
}  // namespace kiln::cpu
