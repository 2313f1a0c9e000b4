// Accuracy-budgeted mixed precision: keep the fewest layers in higher precision that bring the
// reduced-precision model's output, on held-out data, within a budget of float32's by one of
// three measures (AccuracyMetric). Two targets (BudgetTarget):
//   INT8 and FP8 builds: quantized convolutions (and matrix products) kept in float, measured on
//     the CPU engine, whose INT8 kernels and FP8 arithmetic are the reference the GPU matches (so
//     the choice holds for GPU engines too);
//   fp16 GPU builds: layers kept in float32 (BuildOptions::fp32_layers), measured on the GPU
//     against the strict float32 GPU engine.
// The measures:
//   top-1: the top-1 agreement with float32 drops by at most the budget, in percentage points
//          (a classifier's [N, classes] output, compared row by row);
//   cosine: the cosine similarity of the whole output with float32's is at least 1 - budget
//          (any output: a transformer's hidden states, a detector's maps);
//   relative L2: the output's relative L2 error against float32 is at most the budget.
//
// 1. float32 outputs of the held-out batches: the reference.
// 2. The reduced model; within budget: done.
// 3. Sensitivity: each eligible layer alone kept in float; the relative L2 error of the output
//    against float32 ranks them (most sensitive: the lowest error without it; a non-finite
//    output ranks last).
// 4. Layers are kept in float in that order, one more at a time, until the budget is met.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "calibration/calibration_data.h"

namespace kiln::calibration {

enum class AccuracyMetric { kTop1, kCosine, kRelativeL2 };
// "top1", "cosine", "relative-l2"; throws kInvalidArgument naming the flag for anything else.
AccuracyMetric parse_accuracy_metric(const std::string& name);
std::string to_string(AccuracyMetric metric);

// The output against float32's, by every measure.
struct OutputScore {
  double agreement = 0;  // top-1 agreement, %
  double error = 0;      // relative L2 error
  double cosine = 0;     // cosine similarity
  // The measure `metric` takes from this score (agreement in %, cosine, error).
  double value(AccuracyMetric metric) const;
  // Whether the score is within `budget` by `metric`.
  bool within(AccuracyMetric metric, double budget) const;
};

struct LayerSensitivity {
  std::string layer;
  OutputScore score;  // with this layer alone in float
};

// What the budget reduces and what it measures against.
struct BudgetTarget {
  BuildOptions reference;  // the float32 build whose outputs are the reference
  BuildOptions reduced;    // the reduced-precision build
  std::string name;        // "INT8", "FP8", "fp16": for the log
  // The reduced engine's layers that may be kept in float.
  std::function<bool(const LayerInfo&)> eligible;
  // Keeps `layers` in float in a copy of `reduced`.
  std::function<void(BuildOptions&, const std::vector<std::string>& layers)> keep;
  // A timing cache file the target made for its builds (none given): removed when the analysis ends.
  std::string temporary_timing_cache;
};

// INT8 or FP8 (`precision`) from calibrated `scales` on the CPU engine, every eligible layer
// quantized (no timed mix).
BudgetTarget quantized_budget_target(const std::map<std::string, float>& scales, Precision precision);
// An fp16 (or best) GPU build as `fp16` gives it (shapes, profiles, GPU, timing cache), layers
// kept in float32; the reference is the same build at strict float32. The builds share a timing
// cache (a temporary file unless `fp16` names one), so that only the first times tactics.
BudgetTarget fp16_budget_target(const BuildOptions& fp16);

struct BudgetReport {
  double budget = 0;
  AccuracyMetric metric = AccuracyMetric::kTop1;
  OutputScore quantized;  // every eligible layer in reduced precision
  OutputScore final;      // with float_layers kept in float
  std::vector<LayerSensitivity> ranking;        // most sensitive first (empty when not needed)
  std::vector<std::string> float_layers;        // the layers kept in float, in order
  bool met = false;
};

// `heldout`: batches (every input's tensor), not used for calibration. The model's first output
// is measured (top-1 takes its last dimension for the classes).
// `rank_every_layer`: the ranking even when the reduced model is within budget (a report of
// every layer's sensitivity, `kiln debug precision`).
BudgetReport fit_accuracy_budget(const std::string& model_path, const BudgetTarget& target, const std::vector<Feeds>& heldout,
                                 AccuracyMetric metric, double budget,
                                 const std::function<void(const std::string&)>& log = nullptr, bool rank_every_layer = false);

// Splits calibration data (any source of calibration_data.h but the caller's) into its last
// `heldout` batches (returned) and the number of batches before them (`calibration_batches`,
// for CalibrationOptions::max_batches). `leave_calibration` false (data only measured on, an
// fp16 budget): all batches may be taken, and fewer than `heldout` are all there are.
std::vector<Feeds> heldout_batches(const std::string& model_path, const CalibrationSource& source, int heldout,
                                   int& calibration_batches, bool leave_calibration = true);

}  // namespace kiln::calibration
