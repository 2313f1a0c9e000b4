#include "tools/engine_options.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <sstream>

#include "onnx/importer.h"
#include "calibration/accuracy_budget.h"
#include "engine/engine_file.h"
#include "calibration/calibrate_model.h"
#include "tools/calibration_flags.h"
#include "tools/random_inputs.h"
#include "tools/shapes.h"

namespace kiln::tools {

void EngineOptions::add_to(CLI::App* cmd, const std::string& device_default, bool shape_options, bool image_options) {
  if (image_options) image.add_to(cmd);
  device = device_default;
  cmd->add_option("--device", device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--fp16", fp16, "GPU: float16 storage (float32 accumulation); layers that must stay float32 do");
  cmd->add_flag("--tf32", tf32, "GPU: float32 storage, TF32 tensor-core products");
  cmd->add_flag("--fp32", fp32, "GPU: strict float32, the default (no tensor cores, no Winograd)");
  cmd->add_flag("--best", best, "GPU: float16 where supported, TF32 elsewhere");
  cmd->add_flag("--bf16", bf16,
                "CPU: float32 storage, the products of MatMul, Gemm and convolutions by constant weights and of "
                "attention in bfloat16 (operands rounded, float32 sums) on AMX-BF16 or AVX512-BF16 where the CPU has "
                "them");
  cmd->add_flag("--int8", int8,
                "INT8 convolutions from calibrated scales (--calib or --calib-cache); other layers fp16 on the GPU, "
                "float32 on the CPU. On the GPU each layer stays INT8 only where timing shows it faster than fp16");
  cmd->add_flag("--int8-all", int8_all,
                "With --int8 on the GPU: every eligible layer in INT8, without timing it against fp16");
  cmd->add_flag("--fp8", fp8,
                "FP8 (E4M3) convolutions on Hopper's FP8 tensor cores from the same calibrated scales as --int8; "
                "other layers fp16 (the CPU engine runs the float reference). On the GPU each layer stays FP8 only "
                "where timing shows it faster than fp16");
  cmd->add_flag("--fp8-all", fp8_all,
                "With --fp8 on the GPU: every eligible layer in FP8, without timing it against fp16");
  cmd->add_option("--calib", calib_data, "INT8 / FP8 calibration data: a .npy file (split into --calib-batch rows), a folder of .npy batches or of images, "
                  "fashion-mnist, or for a model of several inputs a folder of <input name>.npy files (rows split into batches) "
                  "or of subfolders holding one batch each");
  cmd->add_option("--calib-algo", calib_algo, "entropy (KL divergence, as TensorRT), minmax or percentile")->capture_default_str();
  cmd->add_option("--calib-percentile", calib_percentile, "For --calib-algo percentile: the share of |x| kept, in %")
      ->capture_default_str();
  cmd->add_option("--calib-batches", calib_batches, "Calibrate on at most this many batches (0: all)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--calib-batch", calib_batch, "Rows per calibration batch when --calib is one .npy file")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--calib-cache", calib_cache,
                  "Calibration cache: read when it exists (a cache of another model is refused), else written after calibrating");
  cmd->add_option("--layer-precision", layer_precision,
                  "Pin a layer's precision (repeatable): in an INT8 or FP8 build NAME=fp16 keeps it out of INT8, NAME=fp32 "
                  "too and in float32 on the GPU; in an fp16 or best GPU build NAME=fp32 keeps it in float32 (names as "
                  "`kiln inspect --optimize` lists the layers)");
  cmd->add_option_function<std::string>(
      "--layerPrecisions",
      [this](const std::string& specs) {
        // trtexec's spelling: NAME:PRECISION[,NAME:PRECISION...]
        size_t start = 0;
        while (start <= specs.size()) {
          const size_t comma = std::min(specs.find(',', start), specs.size());
          std::string item = specs.substr(start, comma - start);
          const size_t colon = item.rfind(':');
          if (colon == std::string::npos)  // a CLI11 error: this runs while the command line is parsed
            throw CLI::ValidationError("--layerPrecisions", specs + ": expected NAME:PRECISION[,NAME:PRECISION...]");
          item[colon] = '=';
          layer_precision.push_back(item);
          start = comma + 1;
        }
      },
      "trtexec's spelling of --layer-precision: NAME:fp32[,NAME:fp16...]");
  cmd->add_option("--accuracy-budget", accuracy_budget,
                  "INT8 / FP8: keep the fewest quantized layers in float so that the output on held-out calibration "
                  "batches stays within this budget of float32's, by --accuracy-metric. fp16 / best GPU builds: keep the "
                  "fewest layers in float32 so that the output (on --calib DATA, else on --budget-batches batches of random "
                  "inputs) stays within it of the float32 engine's")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--accuracy-metric", accuracy_metric,
                  "What --accuracy-budget measures: top1 (points of top-1 agreement lost; classifiers), cosine "
                  "(1 - cosine similarity of the output) or relative-l2 (the output's relative L2 error)")
      ->capture_default_str()
      ->check(CLI::IsMember({"top1", "cosine", "relative-l2"}));
  cmd->add_option("--budget-report", budget_report,
                  "With --accuracy-budget: write the analysis as JSON to FILE: the all-quantized score, every "
                  "quantized layer's score with it alone in float (ranked, even when none must stay float), the layers kept "
                  "in float and the score with them (kiln debug precision reads it)");
  cmd->add_option("--budget-batches", budget_batches, "Calibration batches held out for --accuracy-budget (from the end)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  if (shape_options) {
    cmd->add_option("--shapes", shapes, "Fixed input shapes, e.g. --shapes input:8x3x224x224");
    cmd->add_option("--min-shapes,--minShapes", min_shapes,
                    "GPU optimization profile: the smallest shape of every dynamic input, e.g. ids:1x16,mask:1x16 or "
                    "ids:1x16 mask:1x16 (repeat the three flags for more profiles)");
    cmd->add_option("--opt-shapes,--optShapes", opt_shapes, "GPU optimization profile: the shapes to run fastest (default: the max)");
    cmd->add_option("--max-shapes,--maxShapes", max_shapes, "GPU optimization profile: the largest input shapes");
    cmd->add_option("--profile-timing-step", profile_timing_step,
                    "Time tactics at each profile's min, opt and max shapes and at shapes this factor apart (in "
                    "elements) between them; 1: only min, opt and max")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--dim", dims, "Bind a dynamic dimension by name, e.g. --dim seq=128 (repeatable)");
    cmd->add_option("--input-values", input_values,
                    "GPU: plan for these values of an input that sets parameters (a Reduce's axes, Resize's sizes, "
                    "TopK's k, ...), e.g. --input-values axes=1,2 (repeatable); runs with other values are planned "
                    "for them on first use");
    cmd->add_option("--batch", batch, "The first dimension of inputs whose first dimension is dynamic")->check(CLI::PositiveNumber);
  }
  cmd->add_option("--timing-cache,--timingCacheFile", timing_cache, "Timing cache file: read if present, updated after the build");
  CLI::Option* strict_flag = cmd->add_flag(
      "--strict", strict,
      "GPU: fail the build when a node has no GPU layer (by default such nodes run on the CPU engine inside the GPU "
      "engine, and the build names them)");
  cmd->add_flag("--allow-cpu-fallback", allow_cpu_fallback,
                "GPU: run nodes without a GPU layer on the CPU engine (the default; the opposite of --strict)")
      ->excludes(strict_flag);
  cmd->add_flag("--no-gpu-row-stages", no_gpu_row_stages,
                "GPU: run every node after one whose output shapes depend on the data on the CPU engine (by default "
                "the per-region heads among them, such as a detection model's box and mask heads, run on the GPU)");
  cmd->add_flag("--no-optimize", no_optimize, "Skip kiln's graph passes");
  CLI::Option* verbose_flag = cmd->add_flag("-v,--verbose", verbose, "Print every layer as it is built, with its tactic");
  cmd->add_flag("-q,--quiet", quiet, "No build progress (errors and results only)")->excludes(verbose_flag);
  cmd->add_option("--gpu", gpu,
                  "The GPU to build on and run on, as CUDA numbers the GPUs this process sees (default 0)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-memory", max_memory,
                  "The most memory a run may take (e.g. 8G, 512M; default: the machine's memory on the CPU, the GPU's "
                  "on the GPU); a tensor that would pass it is refused before it is allocated");
  cmd->add_option("--mark-outputs", mark_outputs, "Also output these values (names, or 'all'), to compare layer by layer")
      ->delimiter(',');
  cmd->add_option("--threads", threads,
                  "CPU engine: threads of its parallel loops, the calling one included (default: every CPU this process "
                  "may run on)")
      ->check(CLI::Range(1, 4096))
      ->each([](const std::string& n) { set_cpu_threads(std::stoi(n)); });
}

Precision EngineOptions::precision() const {
  int n = fp16 + tf32 + fp32 + best + bf16;
  if (n + int8 + fp8 > 1)
    throw Error(ErrorKind::kInvalidArgument, "give one of --fp16, --tf32, --fp32, --best, --bf16, --int8, --fp8");
  if (bf16) return Precision::kBf16;
  if (int8) return Precision::kInt8;
  if (fp8) return Precision::kFp8;
  if (fp16) return Precision::kFp16;
  if (tf32) return Precision::kTf32;
  if (best) return Precision::kBest;
  return Precision::kFp32;
}

BuildOptions EngineOptions::build_options(const std::string& model, std::vector<std::string>& defaulted) const {
  BuildOptions b;
  b.optimize = !no_optimize;
  b.device = device == "cuda" ? Device::kCuda : Device::kCpu;
  b.precision = precision();
  b.timing_cache = timing_cache;
  b.allow_cpu_fallback = !strict;
  b.gpu_row_stages = !no_gpu_row_stages;
  b.mark_outputs = mark_outputs;
  b.max_memory = max_memory_bytes();
  b.gpu = gpu;
  for (const std::string& spec : input_values) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error(ErrorKind::kInvalidArgument, "--input-values '" + spec + "': expected NAME=V1,V2,... (e.g. axes=1,2)");
    const std::string name = spec.substr(0, eq), list = spec.substr(eq + 1);
    std::vector<double> numbers;
    size_t start = 0;
    while (start <= list.size()) {
      const size_t comma = std::min(list.find(',', start), list.size());
      const std::string item = list.substr(start, comma - start);
      char* end = nullptr;
      const double v = item.empty() ? 0 : std::strtod(item.c_str(), &end);
      if (item.empty() || end != item.c_str() + item.size())
        throw Error(ErrorKind::kInvalidArgument, "--input-values '" + spec + "': '" + item + "' is not a number");
      numbers.push_back(v);
      start = comma + 1;
    }
    if (!b.input_values.emplace(name, Tensor::from_vector<double>({static_cast<int64_t>(numbers.size())}, numbers)).second)
      throw Error(ErrorKind::kInvalidArgument, "--input-values names input '" + name + "' twice");
  }
  const bool quantized = int8 || fp8;
  const bool half = !quantized && (b.precision == Precision::kFp16 || b.precision == Precision::kBest);
  if (!quantized && !half && (!calib_data.empty() || !calib_cache.empty() || !layer_precision.empty() || accuracy_budget >= 0))
    throw Error(ErrorKind::kInvalidArgument,
                "--calib, --calib-cache, --layer-precision and --accuracy-budget are for INT8, FP8 and fp16 builds")
        .hint("add --int8, --fp8 or --fp16");
  if (half && !calib_cache.empty())
    throw Error(ErrorKind::kInvalidArgument, "--calib-cache holds INT8 and FP8 scales; an fp16 build has none").hint("add --int8");
  if (half && !calib_data.empty() && accuracy_budget < 0)
    throw Error(ErrorKind::kInvalidArgument, "--calib in an fp16 build is the data --accuracy-budget measures on, and "
                                             "--accuracy-budget is not given")
        .hint("add --accuracy-budget, e.g. --accuracy-budget 0.001 --accuracy-metric cosine");
  // trtexec's --calib names a cache; kiln's names data. A file that is not .npy is taken for a cache.
  std::error_code ec;
  if (!calib_data.empty() && std::filesystem::is_regular_file(calib_data, ec) &&
      std::filesystem::path(calib_data).extension() != ".npy")
    throw Error(ErrorKind::kInvalidArgument,
                "--calib " + calib_data + ": --calib takes calibration data (a .npy file, a folder of .npy batches or "
                "images, or fashion-mnist), and this file is none of them")
        .hint("a calibration cache (kiln's or TensorRT's, as trtexec's --calib takes) goes to --calib-cache " +
              calib_data);
  if (fp8_all && !fp8) throw Error(ErrorKind::kInvalidArgument, "--fp8-all goes with --fp8").hint("add --fp8");
  if (int8_all && !int8) throw Error(ErrorKind::kInvalidArgument, "--int8-all goes with --int8").hint("add --int8");
  b.quantized_where_faster = !fp8_all && !int8_all;
  if (!budget_report.empty() && accuracy_budget < 0)
    throw Error(ErrorKind::kInvalidArgument, "--budget-report writes the analysis of --accuracy-budget, which is not given")
        .hint("add --accuracy-budget, e.g. --accuracy-budget 0.5");
  if (accuracy_metric != "top1" && accuracy_budget < 0)
    throw Error(ErrorKind::kInvalidArgument, "--accuracy-metric " + accuracy_metric + " measures for --accuracy-budget, which is not given")
        .hint("add --accuracy-budget, e.g. --accuracy-budget 0.001 --accuracy-metric cosine");
  for (const std::string& lp : layer_precision) {
    const size_t eq = lp.rfind('=');
    const std::string p = eq == std::string::npos ? "" : lp.substr(eq + 1);
    if (eq == std::string::npos || eq == 0 || (p != "fp16" && p != "fp32" && p != "int8"))
      throw Error(ErrorKind::kInvalidArgument, "--layer-precision " + lp + ": expected NAME=fp16, NAME=fp32 or NAME=int8");
    if (half && p != "fp32")
      throw Error(ErrorKind::kInvalidArgument, "--layer-precision " + lp + ": every layer of an fp16 build is fp16 or float32")
          .hint("NAME=fp32 keeps a layer in float32");
    const std::string name = lp.substr(0, eq);
    if (p == "fp32") b.fp32_layers.push_back(name);
    if (quantized && p != "int8") b.float_layers.push_back(name);
  }
  // Progress: every layer with --verbose, else about every tenth of the layers.
  const bool all = verbose;
  if (!quiet) b.log = [all](const std::string& line) {
    long i = 0, n = 0;
    if (!all && std::sscanf(line.c_str(), "[%ld/%ld]", &i, &n) == 2 && n > 0 && i != n && (i * 10 / n) == ((i - 1) * 10 / n))
      return;
    std::cerr << "kiln build: " << line << std::endl;
  };
  if (has_profiles()) b.profiles = parse_profiles(min_shapes, opt_shapes, max_shapes);
  b.profile_timing_step = profile_timing_step;
  if (b.device == Device::kCpu) {
    if (precision() != Precision::kFp32 && precision() != Precision::kInt8 && precision() != Precision::kFp8 &&
        precision() != Precision::kBf16)
      throw Error(ErrorKind::kInvalidArgument, "the CPU engine runs float32, bfloat16 products (--bf16), INT8 (--int8) or "
                                               "its FP8 reference (--fp8) only");
    if (has_profiles())
      throw Error(ErrorKind::kInvalidArgument, "--min-shapes/--opt-shapes/--max-shapes are for GPU engines: the CPU engine "
                                               "runs any input shape");
    if (int8 || fp8) add_int8(model, b);
    return b;
  }
  ShapeBindings bindings;
  for (const std::string& d : dims) bindings.add_dim_option(d);
  for (const std::string& s : shapes) bindings.add_shapes_option(s);
  bindings.batch = batch;
  ir::Graph g = onnx_import::import_file(model);
  std::vector<std::string> symbols;
  for (const std::string& in : g.inputs) {
    const ir::Value& v = g.value(in);
    if (!v.type.shape) continue;
    for (const ir::Dim& d : *v.type.shape)
      if (d.symbolic()) symbols.push_back(d.symbol);
  }
  check_bindings_used(bindings, g.inputs, symbols);
  std::set<std::string> ranged;  // inputs a profile gives ranges: no fixed shape
  for (size_t p = 0; p < b.profiles.size(); ++p)
    for (const auto& [name, range] : b.profiles[p]) {
      if (std::find(g.inputs.begin(), g.inputs.end(), name) == g.inputs.end())
        throw Error(ErrorKind::kInvalidArgument,
                    "optimization profile " + std::to_string(p) + " names input '" + name + "', which the model does not have");
      ranged.insert(name);
    }
  for (const std::string& in : g.inputs) {
    const ir::Value& v = g.value(in);
    if (!v.type.shape || (ranged.count(in) && !bindings.shapes.count(in))) continue;
    std::vector<int64_t> shape;
    std::vector<std::string> names;
    for (const ir::Dim& d : *v.type.shape) {
      shape.push_back(d.known() ? d.value : -1);
      names.push_back(d.known() ? "" : d.symbol);
    }
    const size_t defaulted_before = defaulted.size();
    b.input_shapes[in] = resolve_shape(in, shape, names, bindings, 1, defaulted);
    // Profiles given: a dynamic input none of them names is left unbound, so that building
    // refuses it by name (compiler/profiles.h) instead of binding it to 1s.
    if (has_profiles() && defaulted.size() > defaulted_before) {
      b.input_shapes.erase(in);
      defaulted.resize(defaulted_before);
    }
  }
  if (int8 || fp8) add_int8(model, b);
  if (half && accuracy_budget >= 0) add_fp16_budget(model, b);
  return b;
}

namespace {

// --budget-report: the accuracy budget's analysis as JSON.
void write_budget_report(const std::string& path, const std::string& model, Precision precision,
                         const calibration::BudgetReport& r) {
  auto score = [](const calibration::OutputScore& s) {
    return nlohmann::json{{"top1_agreement_percent", s.agreement}, {"cosine", s.cosine}, {"relative_l2", s.error}};
  };
  nlohmann::json ranking = nlohmann::json::array();
  for (const calibration::LayerSensitivity& l : r.ranking) ranking.push_back({{"layer", l.layer}, {"alone_in_float", score(l.score)}});
  const nlohmann::json report = {{"model", model},
                                 {"precision", to_string(precision)},
                                 {"metric", calibration::to_string(r.metric)},
                                 {"budget", r.budget},
                                 {"met", r.met},
                                 {"all_quantized", score(r.quantized)},
                                 {"float_layers", r.float_layers},
                                 {"with_float_layers", score(r.final)},
                                 {"ranking", ranking}};
  std::ofstream f(path);
  f << report.dump(1) << "\n";
  if (!f) throw Error(ErrorKind::kInvalidArgument, "cannot write the budget report " + path);
}

// --accuracy-budget: fits `target` on `heldout`, says what it found and writes --budget-report;
// returns the layers to keep in float.
std::vector<std::string> fit_budget(const std::string& model, const EngineOptions& options,
                                    const calibration::BudgetTarget& target, const std::vector<calibration::Feeds>& heldout) {
  namespace q = calibration;
  const q::AccuracyMetric metric = q::parse_accuracy_metric(options.accuracy_metric);
  q::BudgetReport r = q::fit_accuracy_budget(
      model, target, heldout, metric, options.accuracy_budget,
      [&](const std::string& line) {
        if (!options.quiet) std::cerr << "kiln: " << line << std::endl;  // progress: a line per build
      },
      /*rank_every_layer=*/!options.budget_report.empty());
  if (!options.budget_report.empty()) write_budget_report(options.budget_report, model, target.reduced.precision, r);
  const std::string& format = target.name;
  // Each score as the metric reads it, with the relative L2 error beside it.
  auto figure = [&](const q::OutputScore& s) {
    switch (metric) {
      case q::AccuracyMetric::kTop1: return fmt::format("{:.2f}% (error {:.4f})", s.agreement, s.error);
      case q::AccuracyMetric::kCosine: return fmt::format("{:.8f} (error {:.4f})", s.cosine, s.error);
      case q::AccuracyMetric::kRelativeL2: return fmt::format("{:.4f} (cosine {:.8f})", s.error, s.cosine);
    }
    return std::string();
  };
  const char* what = metric == q::AccuracyMetric::kTop1     ? "points: all-{} top-1 agreement with float32"
                     : metric == q::AccuracyMetric::kCosine ? "(cosine): all-{} cosine similarity with float32"
                                                            : "(relative L2): all-{} relative L2 error against float32";
  std::cerr << fmt::format("kiln: accuracy budget {} ", options.accuracy_budget) << fmt::format(fmt::runtime(what), format) << " "
            << figure(r.quantized);
  if (r.float_layers.empty()) {
    std::cerr << ", within budget\n";
  } else {
    std::cerr << fmt::format("; {} layer(s) kept in float -> {}{}\n", r.float_layers.size(), figure(r.final),
                             r.met ? "" : ": budget NOT met with every layer in float");
    for (size_t i = 0; i < r.float_layers.size(); ++i) {
      const auto& l = *std::find_if(r.ranking.begin(), r.ranking.end(),
                                    [&](const q::LayerSensitivity& s) { return s.layer == r.float_layers[i]; });
      std::cerr << fmt::format("kiln:   {} (alone in float: {})\n", l.layer, figure(l.score));
    }
  }
  return r.float_layers;
}

}  // namespace


void EngineOptions::add_int8(const std::string& model, BuildOptions& b) const {
  namespace q = calibration;
  // Held-out batches for the accuracy budget come off the end of the calibration data.
  q::CalibrationOptions c;
  c.data = calib_data;
  c.batch = calib_batch;
  if (q::is_image_folder(calib_data)) c.image = image.options(q::image_input(model), calib_data);
  std::vector<q::Feeds> heldout;
  int usable = 0;
  if (accuracy_budget >= 0) {
    if (calib_data.empty())
      throw Error(ErrorKind::kInvalidArgument, "--accuracy-budget needs --calib DATA: it holds out the last batches to measure on");
    heldout = q::heldout_batches(model, c, budget_batches, usable);
  }
  std::error_code ec;
  if (!calib_cache.empty() && std::filesystem::exists(calib_cache, ec)) {
    std::ifstream f(model, std::ios::binary);
    std::stringstream bytes;
    bytes << f.rdbuf();
    q::CalibrationCache cache = q::read_calibration_cache(calib_cache, q::model_fingerprint(bytes.str()));
    std::cerr << "kiln: INT8 scales of " << cache.scales.size() << " tensors from " << calib_cache << "\n";
    b.int8_scales = cache.scales;
  } else if (!calib_data.empty()) {
    c.algorithm = q::parse_calibration_algorithm(calib_algo);
    c.max_batches = calib_batches;
    if (accuracy_budget >= 0) c.max_batches = calib_batches > 0 ? std::min(calib_batches, usable) : usable;
    c.percentile = calib_percentile;
    c.device = b.device;  // GPU builds calibrate on the GPU
    if (!quiet) c.progress = calibration_progress("kiln");
    q::CalibrationResult r = q::calibrate_model(model, c);
    if (!calib_cache.empty()) {
      q::write_calibration_cache(calib_cache, r.cache);
      std::cerr << "kiln: wrote the calibration cache " << calib_cache << "\n";
    }
    b.int8_scales = r.cache.scales;
  }
  // else: none (a model with Q/DQ pairs has its own; otherwise the build says what is missing)
  if (accuracy_budget >= 0) {
    const q::BudgetTarget target = q::quantized_budget_target(b.int8_scales, b.precision);
    const std::vector<std::string> kept = fit_budget(model, *this, target, heldout);
    b.float_layers.insert(b.float_layers.end(), kept.begin(), kept.end());
  }
}

void EngineOptions::add_fp16_budget(const std::string& model, BuildOptions& b) const {
  namespace q = calibration;
  // The data measured on: --calib DATA's last --budget-batches batches, else as many batches of
  // random inputs (floats ~ N(0,1), integers in 0..9) at the engine's shapes (a profile's opt).
  std::vector<q::Feeds> heldout;
  if (!calib_data.empty()) {
    q::CalibrationOptions c;
    c.data = calib_data;
    c.batch = calib_batch;
    if (q::is_image_folder(calib_data)) c.image = image.options(q::image_input(model), calib_data);
    int before = 0;
    heldout = q::heldout_batches(model, c, budget_batches, before, /*leave_calibration=*/false);
  } else {
    // The shapes the build fixes, or profile 0's opt shapes: what the engine runs first.
    const std::vector<TensorDesc> inputs = model_inputs(model);
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const TensorDesc& d : inputs) {
      if (auto fixed = b.input_shapes.find(d.name); fixed != b.input_shapes.end())
        shapes[d.name] = fixed->second;
      else if (!b.profiles.empty() && b.profiles[0].count(d.name))
        shapes[d.name] = b.profiles[0].at(d.name).opt;
      else
        throw Error(ErrorKind::kInvalidArgument, "--accuracy-budget: input '" + d.name + "' has no shape to make random inputs of")
            .hint("give its shape (--shapes, --dim) or measure on data (--calib DATA)");
    }
    std::mt19937_64 rng(0);
    for (int i = 0; i < budget_batches; ++i) {
      q::Feeds feeds;
      for (const TensorDesc& d : inputs) feeds.emplace(d.name, random_input(d, shapes.at(d.name), rng));
      heldout.push_back(std::move(feeds));
    }
  }
  if (!quiet)
    std::cerr << "kiln: accuracy budget: fp16 against float32 on the GPU, on " << heldout.size() << " batch(es) of "
              << (calib_data.empty() ? std::string("random inputs") : calib_data) << "; one build per layer ranked\n";
  const std::vector<std::string> kept = fit_budget(model, *this, q::fp16_budget_target(b), heldout);
  b.fp32_layers.insert(b.fp32_layers.end(), kept.begin(), kept.end());
}

size_t parse_byte_size(const std::string& text, const std::string& flag) {
  size_t pos = 0;
  double value = -1;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
  }
  std::string unit = text.substr(std::min(pos, text.size()));
  unit.erase(0, unit.find_first_not_of(' '));
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
  const std::string units = "KMGT";
  const size_t power = unit.empty() ? 0 : units.find(unit) + 1;
  double bytes = value;
  for (size_t i = 0; i < power; ++i) bytes *= 1024;
  if (!(value >= 0) || unit.size() > 1 || (unit.size() == 1 && power == 0) || !(bytes < 0x1p63))
    throw Error(ErrorKind::kInvalidArgument, flag + " " + text + ": expected a size such as 8G, 512M or 1000000 (bytes)");
  return static_cast<size_t>(bytes);
}

void add_model_option(CLI::App* cmd, std::string& model, bool engine_files) {
  cmd->add_option("model", model, engine_files ? "ONNX model file or kiln engine file" : "ONNX model file");
  cmd->add_option("--onnx", model, "The ONNX model (trtexec's spelling of MODEL)");
  if (engine_files) cmd->add_option("--loadEngine", model, "A kiln engine file (trtexec's spelling of MODEL)");
}

void check_model_option(CLI::App* cmd, const std::string& model) {
  size_t given = cmd->get_option("model")->count() + cmd->get_option("--onnx")->count();
  for (const CLI::Option* o : cmd->get_options())
    if (o->get_name() == "--loadEngine") given += o->count();
  if (given == 0 || model.empty())
    throw Error(ErrorKind::kInvalidArgument, "no model given").hint("kiln " + cmd->get_name() + " MODEL (or --onnx=MODEL)");
  if (given > 1)
    throw Error(ErrorKind::kInvalidArgument, "the model is given more than once (MODEL, --onnx, --loadEngine): give one");
}

LoadOptions EngineOptions::load_options() const {
  LoadOptions l;
  l.max_memory = max_memory_bytes();
  l.gpu = gpu;
  return l;
}

size_t EngineOptions::max_memory_bytes() const { return max_memory.empty() ? 0 : parse_byte_size(max_memory, "--max-memory"); }

bool is_engine_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8] = {};
  f.read(magic, sizeof magic);
  return f && std::memcmp(magic, "KILNENG1", 8) == 0;
}

std::string engine_file_backend(const std::string& path) {
  const nlohmann::json header = engine_file::read_header(path);
  if (!header.contains("backend") || !header.at("backend").is_string())
    throw Error(ErrorKind::kInvalidModel, "the engine file's header names no backend").file(path);
  return header.at("backend").get<std::string>();
}

}  // namespace kiln::tools
