// Calibrating a model: run it on calibration batches with the CPU engine and turn the |x|
// histogram of every float32 activation (the float inputs and every node output) into an INT8
// scale.
// Used by `kiln calibrate` and `kiln quantize`.
#pragma once

#include <functional>
#include <string>

#include "kiln/kiln.h"
#include "calibration/calibration.h"
#include "calibration/calibration_cache.h"
#include "calibration/calibration_data.h"

namespace kiln::calibration {

// The data (calibration_data.h: the batches, from files, images, Fashion-MNIST or the caller)
// and how to turn it into scales.
struct CalibrationOptions : CalibrationSource {
  CalibrationAlgorithm algorithm = CalibrationAlgorithm::kEntropy;
  double percentile = 99.99;
  // Where the model runs: kCuda collects the activations of a float32 GPU engine built at the
  // first batch's shape (a last, shorter batch is skipped); the histograms are built on the host.
  Device device = Device::kCpu;
  int gpu = 0;  // kCuda: the GPU (BuildOptions::gpu)
  // Called after each batch: (batches done, batches in all or 0 when unknown, tensors seen).
  std::function<void(size_t, size_t, size_t)> progress;
};

struct CalibrationResult {
  CalibrationCache cache;  // scales of every tensor that was ever nonzero
  int all_zero = 0;        // tensors left out: never nonzero
  int skipped_batches = 0;  // GPU: batches of another shape than the first
};

CalibrationResult calibrate_model(const std::string& model_path, const CalibrationOptions& options);

}  // namespace kiln::calibration
