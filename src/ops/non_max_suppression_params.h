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

// The boxes a class keeps, for the test of each candidate against all of them.
//
// Kept boxes are held as columns padded to whole blocks of kBlock with boxes of no area (which
// suppress nothing): a candidate is tested against a block at a time without a branch inside
// it, which the compiler vectorizes.
//
// A detection model's batched NMS offsets every class's boxes apart along x and makes one call,
// which keeps nearly every box: tested against every kept box, a selection of n boxes makes about
// n^2 / 2 tests (90,000 boxes: 4 billion). So start() cuts the candidates' x range into bins
// about a typical box wide, and each kept box goes into the columns of the bins its x range
// touches (one over more than kMaxBinsPerBox bins into a list every candidate is tested against).
// A candidate is tested against the bins its own x range touches. That is exact: two boxes whose
// x ranges overlap share a bin (the bin of a point is monotonic in x), and boxes whose x ranges do
// not overlap have an intersection of no width, so they suppress nothing; each pair that is tested
// is tested with the same arithmetic, and the answer is whether any pair suppresses.
class NmsKept {
 public:
  static constexpr size_t kBlock = 16;
  static constexpr int64_t kMaxBins = 4096;
  static constexpr int64_t kMaxBinsPerBox = 16;
  static constexpr size_t kMinCandidatesToBin = 256;  // fewer: one list (binning would cost more)

  // Forgets the kept boxes and bins x for `count` candidate boxes (corners; none: one list).
  void start(const std::array<float, 4>* candidates = nullptr, size_t count = 0) {
    size_ = 0;
    wide_.clear();
    for (int64_t bin = 0; bin < bin_count_; ++bin) bins_[static_cast<size_t>(bin)].clear();
    bin_count_ = 0;
    if (count < kMinCandidatesToBin) return;
    float lo = std::numeric_limits<float>::infinity(), hi = -lo;
    widths_.clear();
    for (size_t i = 0; i < count; ++i) {
      const std::array<float, 4>& b = candidates[i];
      const float width = b[3] - b[1];
      if (!(width > 0) || !std::isfinite(b[1]) || !std::isfinite(b[3])) continue;
      lo = std::min(lo, b[1]);
      hi = std::max(hi, b[3]);
      widths_.push_back(width);
    }
    if (widths_.size() < kMinCandidatesToBin || !std::isfinite(hi - lo)) return;
    auto middle = widths_.begin() + static_cast<std::ptrdiff_t>(widths_.size() / 2);
    std::nth_element(widths_.begin(), middle, widths_.end());
    const float width = std::max(*middle, (hi - lo) / static_cast<float>(kMaxBins));
    if (!(width > 0) || !std::isfinite(width)) return;
    lo_ = lo;
    bin_width_ = width;
    bin_count_ = std::min<int64_t>(kMaxBins, static_cast<int64_t>((hi - lo) / width) + 1);
    if (bin_count_ < 2) {
      bin_count_ = 0;
      return;
    }
    if (static_cast<int64_t>(bins_.size()) < bin_count_) bins_.resize(static_cast<size_t>(bin_count_));
  }
  size_t size() const { return size_; }

  void add(const std::array<float, 4>& box) {
    ++size_;
    const float area = (box[2] - box[0]) * (box[3] - box[1]);
    if (!(area > 0)) return;  // suppresses nothing
    const int64_t first = bin_of(box[1]), last = bin_of(box[3]);
    if (bin_count_ == 0 || last - first >= kMaxBinsPerBox) {
      wide_.add(box, area);
      return;
    }
    for (int64_t bin = first; bin <= last; ++bin) bins_[static_cast<size_t>(bin)].add(box, area);
  }

  // nms_suppresses(kept, box, iou_threshold) for some kept box.
  bool suppress(const std::array<float, 4>& b, float iou_threshold) const {
    const float area_b = (b[2] - b[0]) * (b[3] - b[1]);
    if (!(area_b > 0)) return false;
    if (wide_.any_suppresses(b, area_b, iou_threshold)) return true;
    if (bin_count_ == 0) return false;
    for (int64_t bin = bin_of(b[1]), last = bin_of(b[3]); bin <= last; ++bin)
      if (bins_[static_cast<size_t>(bin)].any_suppresses(b, area_b, iou_threshold)) return true;
    return false;
  }

 private:
  struct Columns {
    size_t size = 0;
    std::vector<float> y1, x1, y2, x2, area;

    void clear() {
      size = 0;
      for (std::vector<float>* c : {&y1, &x1, &y2, &x2, &area}) c->clear();
    }
    void add(const std::array<float, 4>& box, float box_area) {
      if (size == area.size())
        for (std::vector<float>* c : {&y1, &x1, &y2, &x2, &area}) c->resize(size + kBlock, 0.0f);
      y1[size] = box[0], x1[size] = box[1], y2[size] = box[2], x2[size] = box[3];
      area[size] = box_area;
      ++size;
    }
    bool any_suppresses(const std::array<float, 4>& b, float area_b, float iou_threshold) const {
      // The candidate in locals and the columns as plain pointers: nothing the loop reads may
      // alias what it writes, so the compiler vectorizes it (with `b` read through its reference
      // it did not).
      const float b_y1 = b[0], b_x1 = b[1], b_y2 = b[2], b_x2 = b[3];
      const float *py1 = y1.data(), *px1 = x1.data(), *py2 = y2.data(), *px2 = x2.data(), *parea = area.data();
      for (size_t start = 0; start < size; start += kBlock) {
        int hit = 0;
        for (size_t j = start; j < start + kBlock; ++j) {
          const float h = std::min(py2[j], b_y2) - std::max(py1[j], b_y1), w = std::min(px2[j], b_x2) - std::max(px1[j], b_x1);
          const float inter = h * w;
          hit |= (parea[j] > 0) & (h > 0) & (w > 0) & (inter / (parea[j] + area_b - inter) > iou_threshold);
        }
        if (hit) return true;
      }
      return false;
    }
  };

  // The bin of x, never decreasing as x grows (infinities in the end bins); 0 without bins.
  int64_t bin_of(float x) const {
    if (bin_count_ == 0) return 0;
    const float t = (x - lo_) / bin_width_;
    if (!(t > 0)) return 0;
    if (t >= static_cast<float>(bin_count_ - 1)) return bin_count_ - 1;
    return static_cast<int64_t>(t);
  }

  size_t size_ = 0;
  float lo_ = 0, bin_width_ = 1;
  int64_t bin_count_ = 0;  // 0: every kept box in wide_
  std::vector<Columns> bins_;
  Columns wide_;
  std::vector<float> widths_;
};

// boxes [batches, spatial, 4], scores [batches, classes, spatial] (float32, contiguous).
inline std::vector<std::array<int64_t, 3>> non_max_suppression(const float* boxes, const float* scores, int64_t batches,
                                                               int64_t classes, int64_t spatial, const NmsParams& p) {
  std::vector<std::array<int64_t, 3>> selected;
  if (p.max_per_class <= 0) return selected;
  std::vector<int64_t> order;
  std::vector<std::array<float, 4>> corners;
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
      corners.clear();
      for (int64_t i : order) corners.push_back(nms_corners(boxes + (b * spatial + i) * 4, p.center_point_box));
      kept.start(corners.data(), corners.size());
      for (size_t n = 0; n < order.size(); ++n) {
        if (static_cast<int64_t>(kept.size()) >= p.max_per_class) break;
        if (kept.suppress(corners[n], p.iou_threshold)) continue;
        kept.add(corners[n]);
        selected.push_back({b, c, order[n]});
      }
    }
  return selected;
}

}  // namespace kiln::ir
