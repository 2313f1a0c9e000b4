// Accuracy-budgeted mixed precision for INT8 builds: keep the fewest convolutions in float that
// bring the INT8 model's top-1 agreement with float32, on held-out calibration data, within a
// budget (in percentage points).
//
// 1. float32 outputs of the held-out batches (CPU engine): the reference.
// 2. The all-INT8 model; within budget: done.
// 3. Sensitivity: each INT8 convolution alone kept in float; the relative L2 error of the
//    output against float32 ranks them (most sensitive: the lowest error without it).
// 4. Layers are kept in float in that order, one more at a time, until the budget is met.
// The analysis runs on the CPU engine, whose INT8 kernels are the reference the GPU matches,
// so the choice holds for GPU engines too.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "calibration/calibration_data.h"

namespace kiln::calibration {

struct LayerSensitivity {
  std::string layer;
  double error = 0;      // relative L2 error of the output vs float32 with this layer in float
  double agreement = 0;  // top-1 agreement with float32, %, with this layer in float
};

struct BudgetReport {
  double budget_points = 0;
  double agreement_int8 = 0, error_int8 = 0;    // all INT8
  double agreement_final = 0, error_final = 0;  // with float_layers kept in float
  std::vector<LayerSensitivity> ranking;        // most sensitive first (empty when not needed)
  std::vector<std::string> float_layers;        // the layers kept in float, in order
  bool met = false;
};

// `scales`: the calibrated scales; `heldout`: batches (every input's tensor), not used for
// calibration. Classifier outputs ([N, classes], or [..., classes]) are compared row by row.
BudgetReport fit_accuracy_budget(const std::string& model_path, const std::map<std::string, float>& scales,
                                 const std::vector<Feeds>& heldout, double budget_points,
                                 const std::function<void(const std::string&)>& log = nullptr);

// Splits calibration data (any source of calibration_data.h but the caller's) into its last
// `heldout` batches (returned) and the number of batches before them (`calibration_batches`,
// for CalibrationOptions::max_batches).
std::vector<Feeds> heldout_batches(const std::string& model_path, const CalibrationSource& source, int heldout,
                                   int& calibration_batches);

}  // namespace kiln::calibration
