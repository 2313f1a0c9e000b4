// kiln calibrate model.onnx --calib DATA: runs the model on calibration batches with the CPU
// engine, collects a histogram of |x| for every float32 activation (the model's inputs and
// every node output), and writes each tensor's INT8 scale (threshold / 127) to a calibration
// cache (kiln's text format, or TensorRT's), which INT8 builds read.
//
// DATA: a .npy file (its first dimension split into batches of --batch), a folder of .npy
// files (one batch each, in name order), a folder of images (--batch per batch, preprocessed
// with `kiln run`'s image flags), or fashion-mnist (the train split), for a model with one input.
#include <cstdio>

#include "calibration_flags.h"
#include "commands.h"
#include "kiln/kiln.h"
#include "calibration/calibrate_model.h"

namespace kiln::tools {

namespace {

struct CalibrateOptions {
  std::string model;
  CalibrationFlags calibration;
  std::string cache;
  bool tensorrt = false;
};

int calibrate(const CalibrateOptions& o) {
  const calibration::CalibrationResult r = calibration::calibrate_model(o.model, o.calibration.options("kiln calibrate", o.model));
  const std::string path = o.cache.empty() ? o.model + ".calib" : o.cache;
  calibration::write_calibration_cache(path, r.cache, o.tensorrt);
  std::printf("calibrated %zu tensors (%s, %d batches)%s -> %s\n", r.cache.scales.size(), o.calibration.algorithm.c_str(),
              r.cache.batches, r.all_zero ? (", " + std::to_string(r.all_zero) + " all-zero tensors left out").c_str() : "",
              path.c_str());
  return 0;
}

}  // namespace

void add_calibrate_command(CLI::App& app, std::function<int()>& action) {
  auto o = std::make_shared<CalibrateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate", "Compute INT8 scales of every activation from calibration data (CPU engine) into a calibration cache");
  cmd->add_option("model", o->model, "ONNX model file (one input)")->required();
  o->calibration.add_to(cmd, /*data_required=*/true);
  cmd->add_option("--calib-cache,-o", o->cache, "Cache file to write (default MODEL.calib); a name ending in .trt gets TensorRT's format");
  cmd->add_flag("--tensorrt", o->tensorrt, "Write TensorRT's calibration cache format");
  cmd->callback([o, &action] { action = [o] { return calibrate(*o); }; });
}

}  // namespace kiln::tools
