// NonMaxSuppression's selection (ONNX opsets 10 and 11), shared by the schema, which runs it on
// the values to size the output [selected, 3] (known only when the boxes and scores are), and the
// CPU kernel, which writes what it selects.
//
// Per batch and class: the boxes whose score passes score_threshold (strictly, when given), by
// score from high to low (equal scores: the lower box index first), each kept unless its
// intersection over union with a box already kept passes iou_threshold (strictly), at most
// max_output_boxes_per_class of them. A box is two corners [y1, x1, y2, x2] in either order
// (center_point_box 0) or [x_center, y_center, width, height] (1); a box of no area overlaps
// nothing. Each selection is (batch, class, box index).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace kiln::ir {

struct NmsParams {
  int64_t max_per_class = 0;
  float iou_threshold = 0;
  std::optional<float> score_threshold;
  bool center_point_box = false;
};

// Corners of box b as (y_min, x_min, y_max, x_max).
inline std::array<float, 4> nms_corners(const float* box, bool center_point_box) {
  if (center_point_box) {
    const float xc = box[0], yc = box[1], w = box[2], h = box[3];
    return {yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2};
  }
  return {std::min(box[0], box[2]), std::min(box[1], box[3]), std::max(box[0], box[2]), std::max(box[1], box[3])};
}

inline bool nms_suppresses(const std::array<float, 4>& a, const std::array<float, 4>& b, float iou_threshold) {
  const float area_a = (a[2] - a[0]) * (a[3] - a[1]), area_b = (b[2] - b[0]) * (b[3] - b[1]);
  if (!(area_a > 0) || !(area_b > 0)) return false;
  const float h = std::min(a[2], b[2]) - std::max(a[0], b[0]), w = std::min(a[3], b[3]) - std::max(a[1], b[1]);
  if (!(h > 0) || !(w > 0)) return false;
  const float inter = h * w;
  return inter / (area_a + area_b - inter) > iou_threshold;
}

// The boxes a class keeps, as columns padded to whole blocks of kBlock with boxes of no area
// (which suppress nothing): a candidate is tested against a block at a time without a branch
// inside it, which the compiler vectorizes. A detection model's batched NMS (every class's boxes
// offset apart, one call) keeps nearly every box, so this test runs about n^2 / 2 times.
class NmsKept {
 public:
  static constexpr size_t kBlock = 16;

  void clear() {
    size_ = 0;
    for (std::vector<float>* c : {&y1_, &x1_, &y2_, &x2_, &area_}) c->clear();
  }
  size_t size() const { return size_; }

  void add(const std::array<float, 4>& box) {
    if (size_ == area_.size())
      for (std::vector<float>* c : {&y1_, &x1_, &y2_, &x2_, &area_}) c->resize(size_ + kBlock, 0.0f);
    y1_[size_] = box[0], x1_[size_] = box[1], y2_[size_] = box[2], x2_[size_] = box[3];
    area_[size_] = (box[2] - box[0]) * (box[3] - box[1]);
    ++size_;
  }

  // nms_suppresses(kept, box, iou_threshold) for some kept box: the same arithmetic, box by box.
  bool suppress(const std::array<float, 4>& b, float iou_threshold) const {
    // The candidate in locals and the columns as plain pointers: nothing the loop reads may
    // alias what it writes, so the compiler vectorizes it (with `b` read through its reference
    // it did not).
    const float b_y1 = b[0], b_x1 = b[1], b_y2 = b[2], b_x2 = b[3], area_b = (b_y2 - b_y1) * (b_x2 - b_x1);
    if (!(area_b > 0)) return false;
    const float *y1 = y1_.data(), *x1 = x1_.data(), *y2 = y2_.data(), *x2 = x2_.data(), *area = area_.data();
    for (size_t start = 0; start < size_; start += kBlock) {
      int hit = 0;
      for (size_t j = start; j < start + kBlock; ++j) {
        const float h = std::min(y2[j], b_y2) - std::max(y1[j], b_y1), w = std::min(x2[j], b_x2) - std::max(x1[j], b_x1);
        const float inter = h * w;
        hit |= (area[j] > 0) & (h > 0) & (w > 0) & (inter / (area[j] + area_b - inter) > iou_threshold);
      }
      if (hit) return true;
    }
    return false;
  }

 private:
  size_t size_ = 0;
  std::vector<float> y1_, x1_, y2_, x2_, area_;
};

// boxes [batches, spatial, 4], scores [batches, classes, spatial] (float32, contiguous).
inline std::vector<std::array<int64_t, 3>> non_max_suppression(const float* boxes, const float* scores, int64_t batches,
                                                               int64_t classes, int64_t spatial, const NmsParams& p) {
  std::vector<std::array<int64_t, 3>> selected;
  if (p.max_per_class <= 0) return selected;
  std::vector<int64_t> order;
  NmsKept kept;
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t c = 0; c < classes; ++c) {
      const float* s = scores + (b * classes + c) * spatial;
      order.clear();
      for (int64_t i = 0; i < spatial; ++i)
        if (!p.score_threshold || s[i] > *p.score_threshold) order.push_back(i);
      // A NaN score (no threshold given) sorts last, so the order stays a strict weak one.
      auto key = [s](int64_t i) { return std::isnan(s[i]) ? -std::numeric_limits<float>::infinity() : s[i]; };
      std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return key(i) > key(j); });
      kept.clear();
      for (int64_t i : order) {
        if (static_cast<int64_t>(kept.size()) >= p.max_per_class) break;
        const std::array<float, 4> box = nms_corners(boxes + (b * spatial + i) * 4, p.center_point_box);
        if (kept.suppress(box, p.iou_threshold)) continue;
        kept.add(box);
        selected.push_back({b, c, i});
      }
    }
  return selected;
}

}  // namespace kiln::ir
