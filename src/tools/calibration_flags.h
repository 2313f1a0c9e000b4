// The calibration options that `kiln calibrate` and `kiln quantize` share: their flags
// (with `kiln run`'s image preprocessing flags, for folders of images), and the
// calibration::CalibrationOptions they make (with a progress line on stderr).
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include "calibration/calibrate_model.h"
#include "tools/image_flags.h"

namespace kiln::tools {

// A progress line on stderr for calibration; `tool` names the command.
inline std::function<void(size_t, size_t, size_t)> calibration_progress(const std::string& tool) {
  const auto start = std::chrono::steady_clock::now();
  return [start, tool](size_t done, size_t all, size_t tensors) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "\r%s: calibration batch %zu/%zu, %zu tensors, %.1f s", tool.c_str(), done, all, tensors, s);
    if (done == all) std::fprintf(stderr, "\n");
  };
}

struct CalibrationFlags {
  std::string data;
  std::string algorithm = "entropy";
  double percentile = 99.99;
  int batches = 0;  // 0: all
  int batch = 8;
  std::string device = "cpu";
  int gpu = 0;
  ImageFlags image;  // --resize, --crop, --mean, --std, --gray: for a folder of images

  void add_to(CLI::App* cmd, bool data_required) {
    auto* calib = cmd->add_option("--calib", data,
                                  "Calibration data: a .npy file (split into batches of --batch), a folder of .npy batches or of images, or fashion-mnist; "
                                  "for a model of several inputs, a folder of <input name>.npy files (split into batches) or of subfolders holding them (one batch each)");
    if (data_required) calib->required();
    cmd->add_option("--calib-algo", algorithm, "entropy (KL divergence, as TensorRT), minmax or percentile")
        ->capture_default_str();
    cmd->add_option("--percentile", percentile, "For --calib-algo percentile: the share of |x| kept, in %")
        ->capture_default_str();
    cmd->add_option("--calib-batches", batches, "Use at most this many batches (0: all)")->check(CLI::NonNegativeNumber);
    cmd->add_option("--device", device, "Run the model for calibration on cpu or cuda (a float32 GPU engine)")
        ->capture_default_str()
        ->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_option("--gpu", gpu, "With --device cuda: the GPU to run on (CUDA's index)")->capture_default_str()->check(CLI::NonNegativeNumber);
    cmd->add_option("--batch", batch, "Rows per batch when --calib is one .npy file, images per batch for a folder of images or fashion-mnist")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    image.add_to(cmd);
  }

  // `tool` names the command in the progress line; for a folder of images, the image flags are
  // resolved against `model`'s input.
  calibration::CalibrationOptions options(const std::string& tool, const std::string& model) const {
    calibration::CalibrationOptions c;
    c.algorithm = calibration::parse_calibration_algorithm(algorithm);
    c.data = data;
    c.batch = batch;
    c.max_batches = batches;
    c.percentile = percentile;
    c.device = device == "cuda" ? Device::kCuda : Device::kCpu;
    c.gpu = gpu;
    c.progress = calibration_progress(tool);
    if (calibration::is_image_folder(data)) c.image = image.options(calibration::image_input(model), data);
    return c;
  }
};

}  // namespace kiln::tools
