// Calibration data (see calibration_data.h).
#include "calibration/calibration_data.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>

#include "io/idx.h"
#include "io/npy.h"

namespace kiln::calibration {

namespace {

namespace fs = std::filesystem;

bool is_image(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* x : {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm"})
    if (e == x) return true;
  return false;
}

bool is_npy(const fs::path& p) { return p.extension() == ".npy"; }

// The files of a folder that pass `want`, sorted by name.
std::vector<std::string> files_in(const std::string& dir, bool (*want)(const fs::path&)) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && want(entry.path())) files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> subfolders_of(const std::string& dir) {
  std::vector<std::string> dirs;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_directory()) dirs.push_back(entry.path().string());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::string input_names(const std::vector<TensorDesc>& inputs) {
  std::string s;
  for (const TensorDesc& d : inputs) s += (s.empty() ? "" : ", ") + d.name + ".npy";
  return s;
}

// `<input>.npy` in `dir` for every input; throws naming the first one missing.
std::map<std::string, std::string> files_per_input(const std::string& dir, const std::vector<TensorDesc>& inputs) {
  std::map<std::string, std::string> files;
  std::error_code ec;
  for (const TensorDesc& d : inputs) {
    const fs::path f = fs::path(dir) / (d.name + ".npy");
    if (d.name.find('/') != std::string::npos || d.name.find('\\') != std::string::npos || d.name == ".." ||
        !fs::is_regular_file(f, ec))
      throw Error(ErrorKind::kInvalidArgument, "calibration folder " + dir + " has no " + d.name + ".npy for input '" + d.name + "'")
          .hint("a model of several inputs calibrates on a folder holding <input name>.npy for each input (" + input_names(inputs) +
                "), or on subfolders that each hold them");
    files[d.name] = f.string();
  }
  return files;
}

// A batch of images decoded and preprocessed for `input` ([N, C, H, W], 1 or 3 channels).
std::vector<Feeds> decode_images(const std::string& dir, const TensorDesc& input, const CalibrationSource& o) {
  std::vector<std::string> images = files_in(dir, is_image);
  if (input.shape.size() != 4 || (input.shape[1] != -1 && input.shape[1] != 1 && input.shape[1] != 3))
    throw Error(ErrorKind::kInvalidArgument, "calibrating on images needs a model input of [N, C, H, W] with 1 or 3 channels; '" +
                                                 input.name + "' is [" + shape_to_string(input.shape) + "]");
  io::ImageOptions image = o.image;
  if (input.shape[2] > 0) image.crop_height = input.shape[2];
  if (input.shape[3] > 0) image.crop_width = input.shape[3];
  if (input.shape[1] == 1 && !image.gray) {
    // As `kiln run`: ImageNet's statistics are for RGB; a gray model gets plain [0, 1] unless told.
    const io::ImageOptions defaults;
    image.gray = true;
    if (image.mean == defaults.mean && image.std == defaults.std) image.mean[0] = 0.f, image.std[0] = 1.f;
  }
  if (image.gray && input.shape[1] == 3)
    throw Error(ErrorKind::kInvalidArgument, "gray calibration images for input '" + input.name + "', which takes 3 channels");
  const size_t per_batch = static_cast<size_t>(o.batch);
  if (o.max_batches > 0 && images.size() > static_cast<size_t>(o.max_batches) * per_batch)
    images.resize(static_cast<size_t>(o.max_batches) * per_batch);
  std::vector<Feeds> batches;
  for (size_t first = 0; first < images.size(); first += per_batch) {
    const size_t n = std::min(images.size() - first, per_batch);
    Tensor batch;
    for (size_t i = 0; i < n; ++i) {
      Tensor one = io::load_image(images[first + i], image);
      if (i == 0) {
        std::vector<int64_t> s = one.shape();
        s[0] = static_cast<int64_t>(n);
        batch = Tensor(DType::kFloat32, s);
      }
      std::memcpy(batch.data<float>() + i * one.numel(), one.data<float>(), one.nbytes());
    }
    batches.push_back({{input.name, std::move(batch)}});
  }
  return batches;
}

}  // namespace

Tensor slice_rows(const Tensor& t, int64_t begin, int64_t end) {
  std::vector<int64_t> shape = t.shape();
  const int64_t row = t.numel() / std::max<int64_t>(shape[0], 1);
  shape[0] = end - begin;
  Tensor out(t.dtype(), shape);
  const size_t bytes = element_size(t.dtype());
  std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + begin * row * bytes, out.nbytes());
  return out;
}

bool is_image_folder(const std::string& data) {
  std::error_code ec;
  return fs::is_directory(data, ec) && files_in(data, is_npy).empty() && !files_in(data, is_image).empty();
}

TensorDesc image_input(const std::string& model_path) {
  const std::vector<TensorDesc> inputs = model_inputs(model_path);
  if (inputs.size() != 1)
    throw Error(ErrorKind::kInvalidArgument, "calibration images feed a model of one input; " + model_path + " has " +
                                                 std::to_string(inputs.size()))
        .hint("calibrate a model of several inputs on a folder holding <input name>.npy for each input");
  return inputs[0];
}

CalibrationData::CalibrationData(const std::vector<TensorDesc>& inputs, const CalibrationSource& source)
    : inputs_(inputs), source_(source) {
  if (inputs_.empty()) throw Error(ErrorKind::kInvalidArgument, "the model has no inputs to calibrate on");
  if (source_.batch <= 0) throw Error(ErrorKind::kInvalidArgument, "a calibration batch needs at least one row");
  if (source_.next_batch) return;  // the caller's batches
  const TensorDesc& first = inputs_[0];
  const bool one_input = inputs_.size() == 1;
  const std::string& data = source_.data;
  std::error_code ec;
  if (data == "fashion-mnist") {
    // Fashion-MNIST's train split, normalized as the model was trained.
    if (!one_input || first.dtype != DType::kFloat32 || first.shape.size() != 4 || first.shape[1] != 1 || first.shape[2] != 28 ||
        first.shape[3] != 28)
      throw Error(ErrorKind::kInvalidArgument, "calibration on fashion-mnist feeds float32 [N, 1, 28, 28] images to one input; the model takes " +
                                                   (one_input ? "'" + first.name + "', " + to_string(first.dtype) + " [" +
                                                                    shape_to_string(first.shape) + "]"
                                                              : std::to_string(inputs_.size()) + " inputs"));
    const io::LabeledImages train = io::load_fashion_mnist("train");
    int64_t rows = train.images.dim(0);
    if (source_.max_batches > 0) rows = std::min<int64_t>(rows, int64_t{source_.max_batches} * source_.batch);
    for (int64_t r = 0; r < rows; r += source_.batch)
      decoded_.push_back({{first.name, io::fashion_mnist_input(train, r, std::min(rows, r + source_.batch))}});
    return;
  }
  if (!fs::exists(data, ec)) throw Error(ErrorKind::kIo, "calibration data " + data + " does not exist");
  if (fs::is_directory(data, ec)) {
    const std::vector<std::string> npys = files_in(data, is_npy);
    const std::vector<std::string> dirs = subfolders_of(data);
    if (npys.empty() && !dirs.empty()) {
      // One batch per subfolder.
      for (const std::string& dir : dirs) {
        std::map<std::string, Piece> batch;
        for (const auto& [name, file] : files_per_input(dir, inputs_)) batch[name] = Piece{file};
        plan_.push_back(std::move(batch));
      }
    } else if (npys.empty()) {
      if (!one_input && !files_in(data, is_image).empty())
        throw Error(ErrorKind::kInvalidArgument, "calibration images feed a model of one input; this one has " +
                                                     std::to_string(inputs_.size()));
      if (files_in(data, is_image).empty())
        throw Error(ErrorKind::kInvalidArgument, "calibration folder " + data + " has no .npy files and no images, nor subfolders of batches")
            .hint(one_input ? "put one batch per .npy file there, or JPEG/PNG images"
                            : "put <input name>.npy there for each input (" + input_names(inputs_) + ")");
      decoded_ = decode_images(data, first, source_);
      return;
    } else if (one_input) {
      for (const std::string& f : npys) plan_.push_back({{first.name, Piece{f}}});
    } else {
      // One file per input, its rows split into batches.
      const std::map<std::string, std::string> files = files_per_input(data, inputs_);
      int64_t rows = -1;
      std::string rows_from;
      for (const auto& [name, file] : files) {
        const Tensor& t = file_rows(file);
        if (t.rank() < 1) throw Error(ErrorKind::kInvalidArgument, file + " holds a scalar, not a batch");
        if (rows >= 0 && t.dim(0) != rows)
          throw Error(ErrorKind::kInvalidArgument, "calibration files disagree on the number of rows: " + rows_from + " has " +
                                                       std::to_string(rows) + ", " + file + " has " + std::to_string(t.dim(0)));
        rows = t.dim(0), rows_from = file;
      }
      for (int64_t r = 0; r < rows; r += source_.batch) {
        std::map<std::string, Piece> batch;
        for (const auto& [name, file] : files) batch[name] = Piece{file, r, std::min(rows, r + source_.batch)};
        plan_.push_back(std::move(batch));
      }
    }
  } else {
    if (!one_input)
      throw Error(ErrorKind::kInvalidArgument, "calibration data " + data + " is one file, but the model has " +
                                                   std::to_string(inputs_.size()) + " inputs")
          .hint("give a folder holding <input name>.npy for each input (" + input_names(inputs_) + ")");
    const Tensor& all = file_rows(data);
    if (all.rank() < 1) throw Error(ErrorKind::kInvalidArgument, data + " holds a scalar, not a batch");
    for (int64_t r = 0; r < all.dim(0); r += source_.batch)
      plan_.push_back({{first.name, Piece{data, r, std::min(all.dim(0), r + source_.batch)}}});
  }
  if (source_.max_batches > 0 && static_cast<size_t>(source_.max_batches) < plan_.size())
    plan_.resize(static_cast<size_t>(source_.max_batches));
}

const Tensor& CalibrationData::file_rows(const std::string& file) {
  auto it = loaded_.find(file);
  if (it == loaded_.end()) it = loaded_.emplace(file, io::read_npy(file)).first;
  return it->second;
}

std::string CalibrationData::where(size_t index) const {
  if (index < plan_.size()) {
    const auto& batch = plan_[index];
    if (batch.size() == 1) return batch.begin()->second.file;
    if (batch.begin()->second.begin < 0) return fs::path(batch.begin()->second.file).parent_path().string();
  }
  return source_.data;
}

bool CalibrationData::next(Feeds& feeds) {
  const size_t index = done_;
  feeds.clear();
  if (source_.next_batch) {
    if (source_.max_batches > 0 && index >= static_cast<size_t>(source_.max_batches)) return false;
    if (!source_.next_batch(feeds)) return false;
  } else if (!decoded_.empty()) {
    if (index >= decoded_.size()) return false;
    feeds = decoded_[index];
  } else {
    if (index >= plan_.size()) return false;
    for (const auto& [name, piece] : plan_[index]) {
      if (piece.begin < 0) {
        feeds[name] = io::read_npy(piece.file);
        continue;
      }
      // Files split into rows stay loaded until their last batch.
      feeds[name] = slice_rows(file_rows(piece.file), piece.begin, piece.end);
      if (index + 1 == plan_.size() || plan_[index + 1].at(name).file != piece.file) loaded_.erase(piece.file);
    }
  }
  ++done_;
  for (const TensorDesc& input : inputs_) {
    auto it = feeds.find(input.name);
    if (it == feeds.end())
      throw Error(ErrorKind::kInvalidArgument, "calibration batch " + std::to_string(index + 1) + " of " + where(index) +
                                                   " has no tensor for input '" + input.name + "'");
    const Tensor& t = it->second;
    if (t.rank() < 1)
      throw Error(ErrorKind::kInvalidArgument, "calibration batch " + std::to_string(index + 1) + " of " + where(index) +
                                                   " is a scalar for input '" + input.name + "', not a batch");
    if (t.dtype() != input.dtype)
      throw Error(ErrorKind::kInvalidArgument, "calibration batch " + std::to_string(index + 1) + " of " + where(index) + " is " +
                                                   to_string(t.dtype()) + " for input '" + input.name + "', which takes " +
                                                   to_string(input.dtype));
  }
  if (feeds.size() != inputs_.size())
    for (const auto& feed : feeds)
      if (std::none_of(inputs_.begin(), inputs_.end(), [&](const TensorDesc& d) { return d.name == feed.first; }))
        throw Error(ErrorKind::kInvalidArgument, "calibration batch " + std::to_string(index + 1) + " of " + where(index) +
                                                     " names '" + feed.first + "', which is not an input of the model");
  return true;
}

}  // namespace kiln::calibration
