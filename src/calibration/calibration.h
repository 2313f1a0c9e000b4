// Post-training calibration: the range of each activation tensor, from which its INT8 scale
// follows (symmetric, per tensor: scale = threshold / 127).
//
// An AbsHistogram collects |x| of every value seen, batch after batch, in 2048 bins from 0 to
// a range that doubles (merging bin pairs) whenever a batch exceeds it, so one pass over the
// calibration data suffices. The threshold is then chosen by one of:
//   kEntropy:    the threshold whose 128-level quantized distribution is closest to the
//                histogram in KL divergence, as TensorRT's entropy calibrator (and
//                "8-bit Inference with TensorRT", Migacz 2017) does;
//   kMinMax:     the largest |x| seen;
//   kPercentile: the |x| below which `percentile` % of the values lie (99.99 by default).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::calibration {

enum class CalibrationAlgorithm { kEntropy, kMinMax, kPercentile };
// "entropy", "minmax", "percentile"; parse throws kInvalidArgument naming the choices.
const char* to_string(CalibrationAlgorithm algorithm);
CalibrationAlgorithm parse_calibration_algorithm(const std::string& name);

class AbsHistogram {
 public:
  static constexpr int kBins = 2048;

  // Adds |x| of n values. NaN is ignored; an infinity is an error (kInvalidArgument), since
  // no finite range covers it.
  void add(const float* x, int64_t n);

  // add() in two steps, for values binned elsewhere (the GPU's calibration, calibration/abs_histogram.h):
  // first the batch's largest |x| (NaN ignored): the range grows to cover it, and false means
  // the batch was all zeros so far and is counted already; otherwise bin each |x| as
  // min(kBins - 1, int(|x| * per_bin())) in double precision and add those counts.
  bool cover(double batch_max, int64_t n);
  double per_bin() const { return kBins / range_; }
  void add_counts(const uint64_t* counts);

  const std::vector<double>& bins() const { return bins_; }
  double range() const { return range_; }     // the histogram covers [0, range]; 0 while empty
  double max_abs() const { return max_abs_; }  // the largest |x| seen
  double count() const { return count_; }
  double bin_width() const { return range_ / kBins; }

 private:
  std::vector<double> bins_ = std::vector<double>(kBins, 0.0);
  double range_ = 0, max_abs_ = 0, count_ = 0;
};

// The calibrated |x| threshold of a histogram; 0 for an empty or all-zero one.
// percentile is used by kPercentile only, in (0, 100].
double calibration_threshold(const AbsHistogram& histogram, CalibrationAlgorithm algorithm, double percentile = 99.99);

// The KL-divergence threshold search itself, on any histogram of |x| with bins of equal width
// (exposed for tests): returns the number of bins m (128..bins) whose range [0, m * width] is
// chosen. The first bin (exact zeros) is given its neighbour's count first (see the .cc).
int entropy_threshold_bins(const std::vector<double>& bins, int levels = 128);

}  // namespace kiln::calibration
