// Accuracy-budgeted mixed precision (see accuracy_budget.h).
#include "calibration/accuracy_budget.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include "calibration/calibration_data.h"

namespace kiln::calibration {

namespace {

struct Score {
  double agreement = 0;  // %
  double error = 0;      // relative L2
};

// The outputs of `options`' engine on every held-out batch, concatenated (first output).
std::vector<float> outputs_of(const std::string& model, const BuildOptions& options, const std::vector<Feeds>& batches,
                              int64_t& classes) {
  Engine engine = Engine::from_onnx(model, options);
  const std::string output = engine.outputs().at(0).name;
  std::vector<float> all;
  for (const Feeds& b : batches) {
    Tensor y = engine.run(b).at(output);
    if (y.dtype() != DType::kFloat32 || y.rank() < 1)
      throw Error(ErrorKind::kUnsupported, "--accuracy-budget compares float32 class scores; output '" + output + "' is " +
                                               to_string(y.dtype()));
    classes = y.shape().back();
    all.insert(all.end(), y.data<float>(), y.data<float>() + y.numel());
  }
  return all;
}

Score score(const std::vector<float>& got, const std::vector<float>& want, int64_t classes) {
  Score s;
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double{got[i]} - want[i];
    err += d * d;
    norm += double{want[i]} * want[i];
  }
  s.error = std::sqrt(err / std::max(norm, 1e-30));
  const size_t rows = want.size() / static_cast<size_t>(classes);
  size_t same = 0;
  for (size_t r = 0; r < rows; ++r) {
    auto a = want.begin() + static_cast<std::ptrdiff_t>(r * classes);
    auto b = got.begin() + static_cast<std::ptrdiff_t>(r * classes);
    same += std::max_element(a, a + classes) - a == std::max_element(b, b + classes) - b;
  }
  s.agreement = rows ? 100.0 * static_cast<double>(same) / static_cast<double>(rows) : 100.0;
  return s;
}


}  // namespace

std::vector<Feeds> heldout_batches(const std::string& model_path, const CalibrationSource& source, int heldout,
                                   int& calibration_batches) {
  CalibrationSource all = source;
  all.max_batches = 0;
  CalibrationData data(model_inputs(model_path), all);
  std::vector<Feeds> batches;
  for (Feeds b; data.next(b);) batches.push_back(std::move(b));
  if (static_cast<int>(batches.size()) <= heldout)
    throw Error(ErrorKind::kInvalidArgument, "--accuracy-budget holds out " + std::to_string(heldout) + " of the " +
                                                 std::to_string(batches.size()) + " calibration batches of " + source.data +
                                                 ", which leaves none to calibrate on")
        .hint("give more calibration data, or fewer --budget-batches");
  calibration_batches = static_cast<int>(batches.size()) - heldout;
  return std::vector<Feeds>(std::make_move_iterator(batches.end() - heldout), std::make_move_iterator(batches.end()));
}

BudgetReport fit_accuracy_budget(const std::string& model, const std::map<std::string, float>& scales,
                                 const std::vector<Feeds>& heldout, double budget_points,
                                 const std::function<void(const std::string&)>& log) {
  BudgetReport report;
  report.budget_points = budget_points;
  auto say = [&](const std::string& line) {
    if (log) log(line);
  };
  BuildOptions fp32;
  int64_t classes = 1;
  const std::vector<float> reference = outputs_of(model, fp32, heldout, classes);
  BuildOptions int8 = fp32;
  int8.precision = Precision::kInt8;
  int8.int8_scales = scales;
  int8.quantized_where_faster = false;  // the sensitivity of every INT8 layer, not a timed mix
  auto measure = [&](const std::vector<std::string>& float_layers) {
    BuildOptions o = int8;
    o.float_layers = float_layers;
    int64_t c = 1;
    return score(outputs_of(model, o, heldout, c), reference, classes);
  };
  const Score all = measure({});
  report.agreement_int8 = report.agreement_final = all.agreement;
  report.error_int8 = report.error_final = all.error;
  say("accuracy budget: all INT8 agrees with float32 on " + std::to_string(all.agreement) + "% (error " +
      std::to_string(all.error) + ")");
  if (100.0 - all.agreement <= budget_points) {
    report.met = true;
    return report;
  }
  // Sensitivity of each INT8 layer.
  std::vector<std::string> layers;
  {
    BuildOptions o = int8;
    for (const LayerInfo& l : Engine::from_onnx(model, o).info().layers)
      if (l.op == "QConv") layers.push_back(l.name);
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const Score s = measure({layers[i]});
    report.ranking.push_back({layers[i], s.error, s.agreement});
    say("accuracy budget: sensitivity " + std::to_string(i + 1) + "/" + std::to_string(layers.size()) + " " + layers[i] +
        ": error " + std::to_string(s.error) + " in float");
  }
  std::stable_sort(report.ranking.begin(), report.ranking.end(),
                   [](const LayerSensitivity& a, const LayerSensitivity& b) { return a.error < b.error; });
  for (const LayerSensitivity& l : report.ranking) {
    report.float_layers.push_back(l.layer);
    const Score s = measure(report.float_layers);
    report.agreement_final = s.agreement;
    report.error_final = s.error;
    say("accuracy budget: " + l.layer + " kept in float: agreement " + std::to_string(s.agreement) + "%, error " +
        std::to_string(s.error));
    if (100.0 - s.agreement <= budget_points) {
      report.met = true;
      break;
    }
  }
  return report;
}

}  // namespace kiln::calibration
