// kiln calibrate model.onnx --calib DATA: runs the model on calibration batches with the CPU
// engine, collects a histogram of |x| for every float32 activation (the model's inputs and
// every node output), and writes each tensor's INT8 scale (threshold / 127) to a calibration
// cache (kiln's text format, or TensorRT's), which INT8 builds read.
//
// DATA: a .npy file (its first dimension split into batches of --batch) or a folder of .npy
// files (one batch each, in name order), for a model with one input. (Image folders and named
// datasets come with INT8 builds.)
#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "commands.h"
#include "io/npy.h"
#include "kiln/kiln.h"
#include "quantization/calibration.h"
#include "quantization/calibration_cache.h"

namespace kiln::tools {

namespace {

namespace fs = std::filesystem;
using quantization::AbsHistogram;

struct CalibrateOptions {
  std::string model;
  std::string data;
  std::string algorithm = "entropy";
  double percentile = 99.99;
  int batches = 0;  // 0: all
  int batch = 8;
  std::string cache;
  bool tensorrt = false;
};

// The calibration batches, loaded one at a time.
std::vector<std::string> batch_files(const std::string& data) {
  std::error_code ec;
  if (fs::is_directory(data, ec)) {
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(data))
      if (entry.is_regular_file() && entry.path().extension() == ".npy") files.push_back(entry.path().string());
    std::sort(files.begin(), files.end());
    if (files.empty())
      throw Error(ErrorKind::kInvalidArgument, "calibration folder " + data + " has no .npy files")
          .hint("put one batch per .npy file there (images come with INT8 builds)");
    return files;
  }
  if (!fs::exists(data, ec)) throw Error(ErrorKind::kIo, "calibration data " + data + " does not exist");
  return {data};
}

Tensor slice_rows(const Tensor& t, int64_t begin, int64_t end) {
  std::vector<int64_t> shape = t.shape();
  const int64_t row = t.numel() / std::max<int64_t>(shape[0], 1);
  shape[0] = end - begin;
  Tensor out(t.dtype(), shape);
  const size_t bytes = element_size(t.dtype());
  std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + begin * row * bytes, out.nbytes());
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, "cannot read " + path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

int calibrate(const CalibrateOptions& o) {
  const auto algorithm = quantization::parse_calibration_algorithm(o.algorithm);
  BuildOptions build;
  build.mark_outputs = {"all"};
  Engine engine = Engine::from_onnx(o.model, build);
  if (engine.inputs().size() != 1)
    throw Error(ErrorKind::kUnsupported, "kiln calibrate takes models with one input; " + o.model + " has " +
                                             std::to_string(engine.inputs().size()));
  const TensorDesc& input = engine.inputs()[0];

  // The batches: whole files from a folder, or rows of one file.
  std::vector<std::string> files = batch_files(o.data);
  std::vector<std::pair<size_t, std::pair<int64_t, int64_t>>> plan;  // file, row range (-1: all)
  if (files.size() == 1 && !fs::is_directory(o.data)) {
    Tensor all = io::read_npy(files[0]);
    if (all.shape().empty()) throw Error(ErrorKind::kInvalidArgument, files[0] + " holds a scalar, not a batch");
    for (int64_t r = 0; r < all.shape()[0]; r += o.batch) plan.push_back({0, {r, std::min(all.shape()[0], r + o.batch)}});
  } else {
    for (size_t i = 0; i < files.size(); ++i) plan.push_back({i, {-1, -1}});
  }
  if (o.batches > 0 && static_cast<size_t>(o.batches) < plan.size()) plan.resize(static_cast<size_t>(o.batches));

  std::map<std::string, AbsHistogram> histograms;
  Tensor whole;
  size_t loaded = files.size();
  const auto start = std::chrono::steady_clock::now();
  for (size_t b = 0; b < plan.size(); ++b) {
    const auto& [file, rows] = plan[b];
    Tensor batch;
    if (rows.first < 0) {
      batch = io::read_npy(files[file]);
    } else {
      if (loaded != file) whole = io::read_npy(files[file]), loaded = file;
      batch = slice_rows(whole, rows.first, rows.second);
    }
    if (batch.dtype() != input.dtype)
      throw Error(ErrorKind::kInvalidArgument, "calibration batch " + files[file] + " is " + to_string(batch.dtype()) +
                                                   "; input '" + input.name + "' takes " + to_string(input.dtype));
    auto outputs = engine.run({{input.name, batch}});
    outputs.emplace(input.name, batch);
    for (const auto& [name, t] : outputs)
      if (t.dtype() == DType::kFloat32) histograms[name].add(t.data<float>(), t.numel());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "\rkiln calibrate: batch %zu/%zu, %zu tensors, %.1f s", b + 1, plan.size(), histograms.size(), s);
  }
  std::fprintf(stderr, "\n");

  quantization::CalibrationCache cache;
  cache.model_fingerprint = quantization::model_fingerprint(read_file(o.model));
  cache.algorithm = o.algorithm;
  cache.batches = static_cast<int>(plan.size());
  int zero = 0;
  for (const auto& [name, h] : histograms) {
    const double threshold = quantization::calibration_threshold(h, algorithm, o.percentile);
    if (threshold <= 0) { ++zero; continue; }  // never nonzero: nothing to scale
    cache.scales[name] = static_cast<float>(threshold / 127.0);
  }
  const std::string path = o.cache.empty() ? o.model + ".calib" : o.cache;
  quantization::write_calibration_cache(path, cache, o.tensorrt);
  std::printf("calibrated %zu tensors (%s, %d batches)%s -> %s\n", cache.scales.size(), o.algorithm.c_str(),
              cache.batches, zero ? (", " + std::to_string(zero) + " all-zero tensors left out").c_str() : "",
              path.c_str());
  return 0;
}

}  // namespace

void add_calibrate_command(CLI::App& app, std::function<int()>& action) {
  auto o = std::make_shared<CalibrateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate", "Compute INT8 scales of every activation from calibration data (CPU engine) into a calibration cache");
  cmd->add_option("model", o->model, "ONNX model file (one input)")->required();
  cmd->add_option("--calib", o->data, "Calibration data: a .npy file (split into batches of --batch) or a folder of .npy batches")
      ->required();
  cmd->add_option("--calib-algo", o->algorithm, "entropy (KL divergence, as TensorRT), minmax or percentile")
      ->capture_default_str();
  cmd->add_option("--percentile", o->percentile, "For --calib-algo percentile: the share of |x| kept, in %")
      ->capture_default_str();
  cmd->add_option("--calib-batches", o->batches, "Use at most this many batches (0: all)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--batch", o->batch, "Rows per batch when --calib is one .npy file")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--calib-cache,-o", o->cache, "Cache file to write (default MODEL.calib); a name ending in .trt gets TensorRT's format");
  cmd->add_flag("--tensorrt", o->tensorrt, "Write TensorRT's calibration cache format");
  cmd->callback([o, &action] { action = [o] { return calibrate(*o); }; });
}

}  // namespace kiln::tools
