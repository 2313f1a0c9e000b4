// Calibrating a model: run it on calibration batches with the CPU engine and turn the |x|
// histogram of every float32 activation (the inputs and every node output) into an INT8 scale.
// Used by `kiln calibrate` and `kiln quantize`.
#pragma once

#include <functional>
#include <string>

#include "io/image.h"
#include "kiln/kiln.h"
#include "calibration/calibration.h"
#include "calibration/calibration_cache.h"

namespace kiln::calibration {

struct CalibrationOptions {
  // A .npy file (its first dimension split into batches of `batch` rows), a folder of .npy
  // files (one batch each, in name order), a folder of images (JPEG, PNG, ...; `batch` per
  // batch, preprocessed with `image` at the input's size), or "fashion-mnist" (the train split,
  // normalized as scripts/train_fashion_mnist.py does), for a model with one input.
  std::string data;
  // Or, when set, batches from the caller (the Python package's calibration from any iterable):
  // each call fills `batch` and returns true, or returns false when there are no more. `data`
  // is then only the name used in messages.
  std::function<bool(Tensor& batch)> next_batch;
  int batch = 8;
  // For image folders, as given except: the crop is the input's H x W where those are fixed,
  // and a one-channel input gets gray images (plain [0, 1] values while mean and std are
  // ImageNet's defaults), as `kiln run` does. tools::ImageFlags makes these from the flags.
  io::ImageOptions image;
  int max_batches = 0;  // 0: all
  CalibrationAlgorithm algorithm = CalibrationAlgorithm::kEntropy;
  double percentile = 99.99;
  // Where the model runs: kCuda collects the activations of a float32 GPU engine built at the
  // first batch's shape (a last, shorter batch is skipped); the histograms are built on the host.
  Device device = Device::kCpu;
  // Called after each batch: (batches done, batches in all or 0 when unknown, tensors seen).
  std::function<void(size_t, size_t, size_t)> progress;
};

struct CalibrationResult {
  CalibrationCache cache;  // scales of every tensor that was ever nonzero
  int all_zero = 0;        // tensors left out: never nonzero
  int skipped_batches = 0;  // GPU: batches of another shape than the first
};

// Rows [begin, end) of a tensor along its first dimension (a calibration batch of a .npy file).
Tensor slice_rows(const Tensor& t, int64_t begin, int64_t end);

CalibrationResult calibrate_model(const std::string& model_path, const CalibrationOptions& options);

// The one input of a model to calibrate (name, dtype, shape with -1 where dynamic); throws
// kiln::Error for a model with another number of inputs.
TensorDesc calibration_input(const std::string& model_path);

// True when `data` is a folder of images without .npy files: calibration decodes the images.
bool is_image_folder(const std::string& data);

}  // namespace kiln::calibration
