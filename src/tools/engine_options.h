// Options shared by the commands that build engines (build, run, bench): device, precision,
// input shapes, timing cache, CPU fallback; and opening a model or an engine file.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <vector>

#include "ir/sizes.h"
#include "kiln/kiln.h"
#include "tools/image_flags.h"

namespace kiln::tools {

struct EngineOptions {
  std::string device = "cuda";
  int gpu = 0;  // --gpu: the GPU (CUDA's device index) GPU engines are built on and run on
  bool fp16 = false, tf32 = false, fp32 = false, best = false;
  bool bf16 = false;  // --bf16: CPU engines' bfloat16 products
  std::vector<std::string> shapes;  // --shapes input:1x3x224x224
  std::vector<std::string> dims;    // --dim N=8
  std::vector<std::string> input_values;  // --input-values axes=1,2
  int64_t batch = -1;               // --batch: the first dim of inputs whose first dim is dynamic
  // Optimization profiles (GPU): the k-th occurrence of each flag makes profile k; one occurrence
  // names every input, as one comma-separated word or several words.
  std::vector<std::vector<std::string>> min_shapes, opt_shapes, max_shapes;
  double profile_timing_step = 4.0;
  std::string timing_cache;
  bool strict = false;              // --strict: nodes without a GPU layer fail the build
  bool allow_cpu_fallback = false;  // --allow-cpu-fallback: the default, said explicitly
  bool no_gpu_row_stages = false;
  bool no_optimize = false;
  bool verbose = false;
  bool quiet = false;
  std::vector<std::string> mark_outputs;
  std::string max_memory;  // --max-memory: "8G", "512MiB", "1000000" (bytes); "": the default
  int threads = 0;         // --threads: the CPU engine's threads (0: every CPU this process may use)
  // INT8: calibration data or a cache (see calibration/calibrate_model.h), and layers pinned
  // to float (--layer-precision NAME=fp16).
  bool int8 = false;
  bool fp8 = false;  // --fp8: the INT8 pipeline with FP8 E4M3 convolutions (Hopper)
  bool fp8_all = false;   // --fp8-all: every eligible layer FP8, not only where faster
  bool int8_all = false;  // --int8-all: every eligible layer INT8, not only where faster
  std::string calib_data, calib_algo = "entropy", calib_cache;
  int calib_batches = 0, calib_batch = 8;
  double calib_percentile = 99.99;
  std::vector<std::string> layer_precision;  // NAME=fp16|fp32|int8 (also from --layerPrecisions)
  double accuracy_budget = -1;  // in accuracy_metric's units; < 0: off
  std::string accuracy_metric = "top1";  // top1, cosine or relative-l2 (calibration/accuracy_budget.h)
  int budget_batches = 1;
  std::string budget_report;  // --budget-report FILE: the accuracy budget's analysis as JSON
  // The preprocessing of a --calib folder of images: `kiln run`'s image flags (build and bench
  // add them with add_to; run passes its own, which also serve --input photo.jpg).
  ImageFlags image;

  // Adds the options to a subcommand (`device_default`: "cuda" for build/bench, "cpu" for run;
  // `shape_options` false for commands that have their own --shapes/--dim/--batch;
  // `image_options` false for commands that have the image flags already).
  void add_to(CLI::App* cmd, const std::string& device_default, bool shape_options = true, bool image_options = true);
  Precision precision() const;
  // Build options for `model`: input shapes resolved from the model's declared inputs and the
  // --shapes/--dim/--batch options (unbound dynamic dims become 1, and `defaulted` lists them);
  // inputs that the profiles (--min-shapes/--opt-shapes/--max-shapes) give ranges get none.
  // With --int8, the scales come from --calib-cache (when the file exists) or from calibrating
  // on --calib (written to --calib-cache when given), with progress on stderr; neither: none
  // (a model with Q/DQ pairs has its own).
  // With --accuracy-budget, the last --budget-batches of --calib are held out and the layers
  // that must stay float are added to the build's float layers (calibration/accuracy_budget.h).
  BuildOptions build_options(const std::string& model, std::vector<std::string>& defaulted) const;
  void add_int8(const std::string& model, BuildOptions& b) const;
  // fp16 / best GPU builds with --accuracy-budget: adds the layers that must stay float32.
  void add_fp16_budget(const std::string& model, BuildOptions& b) const;
  // --max-memory in bytes (0 when not given); throws kInvalidArgument for an unreadable size.
  size_t max_memory_bytes() const;
  // How an engine file is loaded: --max-memory and --gpu.
  LoadOptions load_options() const;
  bool has_profiles() const { return !min_shapes.empty() || !opt_shapes.empty() || !max_shapes.empty(); }
};

// "512M", "8 GiB", "1.5G", "1000000": bytes (K, M, G, T: powers of 1024; a trailing "B" or
// "iB" is allowed). Throws kInvalidArgument naming `flag` for anything else.
size_t parse_byte_size(const std::string& text, const std::string& flag);

// The model of a command: the positional MODEL, or trtexec's --onnx=FILE / --loadEngine=FILE
// (added by add_model_option). Throws kInvalidArgument when none or more than one is given.
void add_model_option(CLI::App* cmd, std::string& model, bool engine_files);
void check_model_option(CLI::App* cmd, const std::string& model);

// True when `path` is a kiln engine file (by its magic), false for anything else.
bool is_engine_file(const std::string& path);
// "cpu" or "cuda": the backend an engine file was built for (reads and checks the file).
std::string engine_file_backend(const std::string& path);


}  // namespace kiln::tools
