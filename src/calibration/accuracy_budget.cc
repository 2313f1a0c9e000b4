// Accuracy-budgeted mixed precision (see accuracy_budget.h).
#include "calibration/accuracy_budget.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>

#include "calibration/calibration_data.h"

namespace kiln::calibration {

namespace {

// The outputs of `options`' engine on every held-out batch, concatenated (first output).
std::vector<float> outputs_of(const std::string& model, const BuildOptions& options, const std::vector<Feeds>& batches,
                              int64_t& classes) {
  Engine engine = Engine::from_onnx(model, options);
  const std::string output = engine.outputs().at(0).name;
  std::vector<float> all;
  for (const Feeds& b : batches) {
    Tensor y = engine.run(b).at(output);
    if (y.dtype() != DType::kFloat32 || y.rank() < 1)
      throw Error(ErrorKind::kUnsupported, "--accuracy-budget compares float32 outputs; output '" + output + "' is " +
                                               kiln::to_string(y.dtype()));
    classes = y.shape().back();
    all.insert(all.end(), y.data<float>(), y.data<float>() + y.numel());
  }
  return all;
}

OutputScore score(const std::vector<float>& got, const std::vector<float>& want, int64_t classes) {
  OutputScore s;
  // An output with an inf or NaN (fp16 overflow) is as far from the reference as can be, and
  // compares so: the sums below would turn it into NaNs that no order or budget handles.
  if (!std::all_of(got.begin(), got.end(), [](float v) { return std::isfinite(v); })) {
    s.error = std::numeric_limits<double>::infinity();
    s.cosine = -1;
    s.agreement = 0;
    return s;
  }
  double err = 0, norm = 0, got_norm = 0, dot = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double{got[i]} - want[i];
    err += d * d;
    norm += double{want[i]} * want[i];
    got_norm += double{got[i]} * got[i];
    dot += double{got[i]} * want[i];
  }
  s.error = std::sqrt(err / std::max(norm, 1e-30));
  // Two zero outputs are the same output; one zero output has nothing in common with the other.
  s.cosine = norm == 0 && got_norm == 0 ? 1.0 : dot / std::max(std::sqrt(norm * got_norm), 1e-300);
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

AccuracyMetric parse_accuracy_metric(const std::string& name) {
  if (name == "top1") return AccuracyMetric::kTop1;
  if (name == "cosine") return AccuracyMetric::kCosine;
  if (name == "relative-l2") return AccuracyMetric::kRelativeL2;
  throw Error(ErrorKind::kInvalidArgument, "--accuracy-metric " + name + ": not a measure kiln knows")
      .hint("top1 (a classifier's top-1 agreement), cosine or relative-l2 (any output)");
}

std::string to_string(AccuracyMetric metric) {
  switch (metric) {
    case AccuracyMetric::kTop1: return "top1";
    case AccuracyMetric::kCosine: return "cosine";
    case AccuracyMetric::kRelativeL2: return "relative-l2";
  }
  return "?";
}

double OutputScore::value(AccuracyMetric metric) const {
  switch (metric) {
    case AccuracyMetric::kTop1: return agreement;
    case AccuracyMetric::kCosine: return cosine;
    case AccuracyMetric::kRelativeL2: return error;
  }
  return 0;
}

bool OutputScore::within(AccuracyMetric metric, double budget) const {
  switch (metric) {
    case AccuracyMetric::kTop1: return 100.0 - agreement <= budget;
    case AccuracyMetric::kCosine: return 1.0 - cosine <= budget;
    case AccuracyMetric::kRelativeL2: return error <= budget;
  }
  return false;
}

std::vector<Feeds> heldout_batches(const std::string& model_path, const CalibrationSource& source, int heldout,
                                   int& calibration_batches, bool leave_calibration) {
  CalibrationSource all = source;
  all.max_batches = 0;
  CalibrationData data(model_inputs(model_path), all);
  std::vector<Feeds> batches;
  for (Feeds b; data.next(b);) batches.push_back(std::move(b));
  if (!leave_calibration) {
    if (batches.empty())
      throw Error(ErrorKind::kInvalidArgument, "--accuracy-budget has no batch to measure on in " + source.data);
    heldout = std::min(heldout, static_cast<int>(batches.size()));
  } else if (static_cast<int>(batches.size()) <= heldout)
    throw Error(ErrorKind::kInvalidArgument, "--accuracy-budget holds out " + std::to_string(heldout) + " of the " +
                                                 std::to_string(batches.size()) + " calibration batches of " + source.data +
                                                 ", which leaves none to calibrate on")
        .hint("give more calibration data, or fewer --budget-batches");
  calibration_batches = static_cast<int>(batches.size()) - heldout;
  return std::vector<Feeds>(std::make_move_iterator(batches.end() - heldout), std::make_move_iterator(batches.end()));
}

BudgetTarget quantized_budget_target(const std::map<std::string, float>& scales, Precision precision) {
  if (precision != Precision::kInt8 && precision != Precision::kFp8)
    throw Error(ErrorKind::kInvalidArgument, "a quantized accuracy budget is for INT8 and FP8 builds");
  BudgetTarget t;
  t.reduced.precision = precision;
  t.reduced.int8_scales = scales;
  t.reduced.quantized_where_faster = false;  // the sensitivity of every quantized layer, not a timed mix
  t.name = precision == Precision::kFp8 ? "FP8" : "INT8";
  t.eligible = [](const LayerInfo& l) { return l.op == "QConv"; };
  t.keep = [](BuildOptions& o, const std::vector<std::string>& layers) { o.float_layers = layers; };
  return t;
}

BudgetTarget fp16_budget_target(const BuildOptions& fp16) {
  if (fp16.device != Device::kCuda || (fp16.precision != Precision::kFp16 && fp16.precision != Precision::kBest))
    throw Error(ErrorKind::kInvalidArgument, "an fp16 accuracy budget is for fp16 (or best) GPU builds");
  BudgetTarget t;
  t.reduced = fp16;
  t.reduced.log = nullptr;
  if (t.reduced.timing_cache.empty()) {
    t.temporary_timing_cache = (std::filesystem::temp_directory_path() /
                                ("kiln-accuracy-budget-" + std::to_string(::getpid()) + ".timing-cache")).string();
    t.reduced.timing_cache = t.temporary_timing_cache;
  }
  t.reference = t.reduced;
  t.reference.precision = Precision::kFp32;
  t.reference.fp32_layers.clear();
  t.name = "fp16";
  t.eligible = [](const LayerInfo& l) { return l.precision == "float16" && !l.cpu_fallback && l.op != "Reformat"; };
  t.keep = [pinned = fp16.fp32_layers](BuildOptions& o, const std::vector<std::string>& layers) {
    o.fp32_layers = pinned;
    o.fp32_layers.insert(o.fp32_layers.end(), layers.begin(), layers.end());
  };
  return t;
}

BudgetReport fit_accuracy_budget(const std::string& model, const BudgetTarget& target, const std::vector<Feeds>& heldout,
                                 AccuracyMetric metric, double budget, const std::function<void(const std::string&)>& log,
                                 bool rank_every_layer) {
  BudgetReport report;
  report.budget = budget;
  report.metric = metric;
  const std::string& format = target.name;
  auto say = [&](const std::string& line) {
    if (log) log(line);
  };
  // A timing cache the target made for its builds goes when the analysis ends.
  struct RemoveOnExit {
    std::string path;
    ~RemoveOnExit() {
      std::error_code ec;
      if (!path.empty()) std::filesystem::remove(path, ec);
    }
  } temporary_cache{target.temporary_timing_cache};
  int64_t classes = 1;
  const std::vector<float> reference = outputs_of(model, target.reference, heldout, classes);
  auto measure = [&](const std::vector<std::string>& float_layers) {
    BuildOptions o = target.reduced;
    target.keep(o, float_layers);
    int64_t c = 1;
    return score(outputs_of(model, o, heldout, c), reference, classes);
  };
  auto figures = [](const OutputScore& s) {
    return "agreement " + std::to_string(s.agreement) + "%, cosine " + std::to_string(s.cosine) + ", error " +
           std::to_string(s.error);
  };
  report.quantized = report.final = measure({});
  say("accuracy budget: all " + format + ": " + figures(report.quantized));
  const bool within = report.quantized.within(metric, budget);
  if (within && !rank_every_layer) {
    report.met = true;
    return report;
  }
  // Sensitivity of each eligible layer.
  std::vector<std::string> layers;
  {
    BuildOptions o = target.reduced;
    target.keep(o, {});
    for (const LayerInfo& l : Engine::from_onnx(model, o).info().layers)
      if (target.eligible(l)) layers.push_back(l.name);
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const OutputScore s = measure({layers[i]});
    report.ranking.push_back({layers[i], s});
    say("accuracy budget: sensitivity " + std::to_string(i + 1) + "/" + std::to_string(layers.size()) + " " + layers[i] +
        ": error " + std::to_string(s.error) + " in float");
  }
  std::stable_sort(report.ranking.begin(), report.ranking.end(),
                   [](const LayerSensitivity& a, const LayerSensitivity& b) { return a.score.error < b.score.error; });
  if (within) {
    report.met = true;
    return report;
  }
  for (const LayerSensitivity& l : report.ranking) {
    report.float_layers.push_back(l.layer);
    const OutputScore s = measure(report.float_layers);
    report.final = s;
    say("accuracy budget: " + l.layer + " kept in float: " + figures(s));
    if (s.within(metric, budget)) {
      report.met = true;
      break;
    }
  }
  return report;
}

}  // namespace kiln::calibration
