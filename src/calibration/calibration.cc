// Calibration thresholds (see calibration.h).
#include "calibration/calibration.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/error.h"

namespace kiln::calibration {

const char* to_string(CalibrationAlgorithm algorithm) {
  switch (algorithm) {
    case CalibrationAlgorithm::kEntropy: return "entropy";
    case CalibrationAlgorithm::kMinMax: return "minmax";
    case CalibrationAlgorithm::kPercentile: return "percentile";
  }
  return "?";
}

CalibrationAlgorithm parse_calibration_algorithm(const std::string& name) {
  if (name == "entropy") return CalibrationAlgorithm::kEntropy;
  if (name == "minmax") return CalibrationAlgorithm::kMinMax;
  if (name == "percentile") return CalibrationAlgorithm::kPercentile;
  throw Error(ErrorKind::kInvalidArgument,
              "unknown calibration algorithm '" + name + "' (choose entropy, minmax or percentile)");
}

void AbsHistogram::add(const float* x, int64_t n) {
  double batch_max = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = std::fabs(static_cast<double>(x[i]));
    if (a > batch_max) batch_max = a;  // false for NaN
  }
  if (!cover(batch_max, n)) return;
  const double scale = per_bin();
  for (int64_t i = 0; i < n; ++i) {
    const double a = std::fabs(static_cast<double>(x[i]));
    if (!(a == a)) continue;  // NaN
    const int b = std::min(kBins - 1, static_cast<int>(a * scale));
    bins_[b] += 1;
    count_ += 1;
  }
}

bool AbsHistogram::cover(double batch_max, int64_t n) {
  if (std::isinf(batch_max)) throw Error(ErrorKind::kInvalidArgument, "calibration data produced an infinite activation");
  max_abs_ = std::max(max_abs_, batch_max);
  if (batch_max == 0 && range_ == 0) {  // all zeros so far: count them in bin 0 of any range
    bins_[0] += static_cast<double>(n);
    count_ += static_cast<double>(n);
    return false;
  }
  if (range_ == 0) {
    range_ = batch_max;
  } else {
    // Double the range until it covers this batch, merging bin pairs: counts stay exact, only
    // the resolution of what was seen before halves.
    while (batch_max > range_) {
      for (int b = 0; b < kBins / 2; ++b) bins_[b] = bins_[2 * b] + bins_[2 * b + 1];
      std::fill(bins_.begin() + kBins / 2, bins_.end(), 0.0);
      range_ *= 2;
    }
  }
  return true;
}

void AbsHistogram::add_counts(const uint64_t* counts) {
  for (int b = 0; b < kBins; ++b) {
    bins_[static_cast<size_t>(b)] += static_cast<double>(counts[b]);
    count_ += static_cast<double>(counts[b]);
  }
}

namespace {

// Adds eps to the zero entries and takes as much from the others (in proportion to their
// number), so KL(p || q) stays finite where q has no mass; false if all entries are zero.
bool smooth(std::vector<double>& d, double eps = 1e-4) {
  size_t zeros = 0;
  for (double v : d) zeros += v == 0;
  if (zeros == d.size()) return false;
  const double take = eps * static_cast<double>(zeros) / static_cast<double>(d.size() - zeros);
  for (double& v : d) v = v == 0 ? eps : v - take;
  return true;
}

double kl_divergence(const std::vector<double>& p, const std::vector<double>& q) {
  double sp = 0, sq = 0;
  for (size_t i = 0; i < p.size(); ++i) sp += p[i], sq += q[i];
  double kl = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double pi = p[i] / sp, qi = q[i] / sq;
    if (pi > 0 && qi > 0) kl += pi * std::log(pi / qi);
  }
  return kl;
}

}  // namespace

int entropy_threshold_bins(const std::vector<double>& histogram, int levels) {
  const int total = static_cast<int>(histogram.size());
  if (total <= levels) return total;
  // The first bin holds every exact zero: after a ReLU, half of all values. Left as it is, that
  // spike dominates the divergence (merging it with its neighbours costs more than clipping the
  // tail), and the search clips far too much. As NVIDIA's calibrators do, it is flattened to
  // its neighbour's count first; zeros are exact in INT8 anyway.
  std::vector<double> bins = histogram;
  bins[0] = bins[1];
  double best = std::numeric_limits<double>::infinity();
  int best_bins = total;
  std::vector<double> p, q;
  for (int i = levels; i <= total; ++i) {
    // P: the first i bins, with everything beyond them clipped into the last one.
    p.assign(bins.begin(), bins.begin() + i);
    double outliers = 0;
    for (int b = i; b < total; ++b) outliers += bins[b];
    p[i - 1] += outliers;
    // Q: the first i bins merged into `levels` groups, each group's count spread evenly over
    // the group's bins that are not empty in P (what quantizing to `levels` levels keeps).
    q.assign(i, 0.0);
    const int merged = i / levels;
    for (int j = 0; j < levels; ++j) {
      const int start = j * merged;
      const int stop = j == levels - 1 ? i : start + merged;
      double sum = 0;
      int nonzero = 0;
      for (int b = start; b < stop; ++b) {
        sum += bins[b];
        nonzero += p[b] != 0;
      }
      if (nonzero == 0) continue;
      for (int b = start; b < stop; ++b)
        if (p[b] != 0) q[b] = sum / nonzero;
    }
    if (!smooth(p) || !smooth(q)) continue;
    const double kl = kl_divergence(p, q);
    if (kl < best) {
      best = kl;
      best_bins = i;
    }
  }
  return best_bins;
}

double calibration_threshold(const AbsHistogram& h, CalibrationAlgorithm algorithm, double percentile) {
  if (h.max_abs() == 0) return 0;
  switch (algorithm) {
    case CalibrationAlgorithm::kMinMax:
      return h.max_abs();
    case CalibrationAlgorithm::kPercentile: {
      if (!(percentile > 0 && percentile <= 100))
        throw Error(ErrorKind::kInvalidArgument, "calibration percentile must be in (0, 100], not " + std::to_string(percentile));
      const double want = h.count() * percentile / 100.0;
      double cumulative = 0;
      for (int b = 0; b < AbsHistogram::kBins; ++b) {
        cumulative += h.bins()[b];
        if (cumulative >= want) return std::min(h.max_abs(), (b + 1) * h.bin_width());
      }
      return h.max_abs();
    }
    case CalibrationAlgorithm::kEntropy:
      // The upper edge of the last bin kept; never beyond the largest value seen.
      return std::min(h.max_abs(), entropy_threshold_bins(h.bins()) * h.bin_width());
  }
  return h.max_abs();
}

}  // namespace kiln::calibration
