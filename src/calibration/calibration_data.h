// Calibration data: where the batches a model is calibrated on come from, each batch a feed of
// every model input (so models of several inputs, a transformer's input_ids, attention_mask and
// token_type_ids, calibrate like image models). Used by calibrate_model.h and accuracy_budget.h.
//
// `data` is one of:
//   - for a model of one input: a .npy file (its rows split into batches of `batch`), a folder
//     of .npy files (one batch each, in name order), a folder of images (JPEG, PNG, ...; `batch`
//     per batch, preprocessed with `image`), or "fashion-mnist" (the train split, normalized as
//     scripts/train_fashion_mnist.py does);
//   - for a model of several inputs: a folder holding `<input name>.npy` for every input (rows
//     split into batches of `batch`; every file has the same number of rows);
//   - for any model: a folder of subfolders (one batch each, in name order), each holding
//     `<input name>.npy` for every input.
// Batches are loaded one at a time (a file split into rows stays loaded while it is used).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/image.h"
#include "kiln/kiln.h"

namespace kiln::calibration {

// One batch: a tensor for every model input, by input name.
using Feeds = std::map<std::string, Tensor>;

struct CalibrationSource {
  std::string data;
  // Or, when set, batches from the caller (the Python package's calibration from any iterable):
  // each call fills one batch and returns true, or returns false when there are no more. `data`
  // is then only the name used in messages.
  std::function<bool(Feeds& batch)> next_batch;
  int batch = 8;
  // For image folders, as given except: the crop is the input's H x W where those are fixed,
  // and a one-channel input gets gray images (plain [0, 1] values while mean and std are
  // ImageNet's defaults), as `kiln run` does. tools::ImageFlags makes these from the flags.
  io::ImageOptions image;
  int max_batches = 0;  // 0: all
};

class CalibrationData {
 public:
  // Plans the batches of `source` for `inputs` (the model's, -1 where dynamic); throws
  // kiln::Error naming the data and the reason when they cannot feed those inputs.
  CalibrationData(const std::vector<TensorDesc>& inputs, const CalibrationSource& source);

  // The number of batches, or 0 when the caller gives them (next_batch).
  size_t size() const { return decoded_.empty() ? plan_.size() : decoded_.size(); }

  // The next batch, every input's dtype checked; false when there are no more.
  bool next(Feeds& feeds);

  // Where batch `index` (from 0) comes from, for messages: a file, or the data's name.
  std::string where(size_t index) const;

 private:
  // Rows [begin, end) of a file, or the whole file (begin < 0).
  struct Piece {
    std::string file;
    int64_t begin = -1, end = -1;
  };
  const Tensor& file_rows(const std::string& file);

  std::vector<TensorDesc> inputs_;
  CalibrationSource source_;
  std::vector<Feeds> decoded_;                        // fashion-mnist and image folders
  std::vector<std::map<std::string, Piece>> plan_;    // the .npy batches, input -> piece
  std::map<std::string, Tensor> loaded_;              // whole files being split into rows
  size_t done_ = 0;
};

// Rows [begin, end) of a tensor along its first dimension (a calibration batch of a .npy file).
Tensor slice_rows(const Tensor& t, int64_t begin, int64_t end);

// True when `data` is a folder of images without .npy files: calibration decodes the images.
bool is_image_folder(const std::string& data);

// The one input of a model calibrated on images (name, dtype, shape with -1 where dynamic);
// throws kiln::Error for a model with another number of inputs.
TensorDesc image_input(const std::string& model_path);

}  // namespace kiln::calibration
