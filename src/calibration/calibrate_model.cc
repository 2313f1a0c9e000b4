// Calibrating a model (see calibrate_model.h).
#include "calibration/calibrate_model.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "io/idx.h"
#include "io/image.h"
#include "io/npy.h"
#include "kiln/kiln.h"
#if KILN_WITH_CUDA
#include "calibration/abs_histogram.h"
#endif

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

// The files of a folder with this extension test, sorted by name.
std::vector<std::string> files_in(const std::string& dir, bool (*want)(const fs::path&)) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && want(entry.path())) files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

bool is_npy(const fs::path& p) { return p.extension() == ".npy"; }

// The calibration batches, loaded one at a time.
std::vector<std::string> batch_files(const std::string& data) {
  std::error_code ec;
  if (fs::is_directory(data, ec)) {
    std::vector<std::string> files = files_in(data, is_npy);
    if (files.empty())
      throw Error(ErrorKind::kInvalidArgument, "calibration folder " + data + " has no .npy files and no images")
          .hint("put one batch per .npy file there, or JPEG/PNG images");
    return files;
  }
  if (!fs::exists(data, ec)) throw Error(ErrorKind::kIo, "calibration data " + data + " does not exist");
  return {data};
}


// The model's one input, with -1 for its dynamic dimensions.
TensorDesc input_of(const std::vector<TensorDesc>& inputs, const std::string& model_path) {
  if (inputs.size() != 1)
    throw Error(ErrorKind::kUnsupported, "calibration takes models with one input; " + model_path + " has " +
                                             std::to_string(inputs.size()));
  return inputs[0];
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, "cannot read " + path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TensorDesc calibration_input(const std::string& model_path) {
  return input_of(model_inputs(model_path), model_path);
}

bool is_image_folder(const std::string& data) {
  std::error_code ec;
  return fs::is_directory(data, ec) && files_in(data, is_npy).empty() && !files_in(data, is_image).empty();
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

CalibrationResult calibrate_model(const std::string& model_path, const CalibrationOptions& o) {
  // The model's input, from the model itself: a GPU engine is built at the first batch's shape.
  const TensorDesc input = input_of(model_inputs(model_path), model_path);
  BuildOptions build;
  build.mark_outputs = {"all"};  // every layer's output (of the optimized graph: the names INT8 builds look up)
  build.device = o.device;
  build.precision = Precision::kFp32;  // the activations of the float model
  std::optional<Engine> engine;
#if KILN_WITH_CUDA
  std::optional<Context> context;
  std::unique_ptr<GpuHistogramCollector> gpu_histograms;  // GPU engines: histograms on the device
#endif
  std::vector<int64_t> engine_shape;
  int skipped = 0;

  std::map<std::string, AbsHistogram> histograms;
  // A named dataset: Fashion-MNIST's train split, normalized as the model was trained.
  std::vector<Tensor> named;
  if (!o.next_batch && o.data == "fashion-mnist") {
    if (input.dtype != DType::kFloat32 || input.shape.size() != 4 || input.shape[1] != 1 || input.shape[2] != 28 ||
        input.shape[3] != 28)
      throw Error(ErrorKind::kInvalidArgument, "calibration on fashion-mnist feeds float32 [N, 1, 28, 28] images; input '" +
                                                   input.name + "' is " + to_string(input.dtype) + " [" +
                                                   shape_to_string(input.shape) + "]")
          .file(model_path);
    const io::LabeledImages train = io::load_fashion_mnist("train");
    int64_t rows = train.images.dim(0);
    if (o.max_batches > 0) rows = std::min<int64_t>(rows, int64_t{o.max_batches} * o.batch);
    for (int64_t r = 0; r < rows; r += o.batch) named.push_back(io::fashion_mnist_input(train, r, std::min(rows, r + o.batch)));
  }
  // A folder of images: decoded and preprocessed with o.image (by default as `kiln run` does:
  // torchvision's ImageNet steps, resize the short side to 256, center crop to the input's
  // H x W, normalize with ImageNet's mean and std; a one-channel input gets gray [0, 1] values).
  std::error_code ec;
  if (!o.next_batch && named.empty() && fs::is_directory(o.data, ec) && files_in(o.data, is_npy).empty()) {
    std::vector<std::string> images = files_in(o.data, is_image);
    if (images.empty())
      throw Error(ErrorKind::kInvalidArgument, "calibration folder " + o.data + " has no .npy files and no images")
          .hint("put one batch per .npy file there, or JPEG/PNG images");
    if (input.shape.size() != 4 || (input.shape[1] != -1 && input.shape[1] != 1 && input.shape[1] != 3))
      throw Error(ErrorKind::kInvalidArgument, "calibrating on images needs a model input of [N, C, H, W] with 1 or 3 channels; '" +
                                                   input.name + "' is [" + shape_to_string(input.shape) + "]")
          .file(model_path);
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
    if (o.max_batches > 0 && images.size() > static_cast<size_t>(o.max_batches) * static_cast<size_t>(o.batch))
      images.resize(static_cast<size_t>(o.max_batches) * static_cast<size_t>(o.batch));
    for (size_t first = 0; first < images.size(); first += static_cast<size_t>(o.batch)) {
      const size_t n = std::min(images.size() - first, static_cast<size_t>(o.batch));
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
      named.push_back(std::move(batch));
    }
  }
  // The batches: whole files from a folder, or rows of one file.
  std::vector<std::string> files = named.empty() && !o.next_batch ? batch_files(o.data) : std::vector<std::string>{};
  std::vector<std::pair<size_t, std::pair<int64_t, int64_t>>> plan;  // file, row range (-1: all)
  if (o.next_batch) {
    // The caller's batches: as many as it gives (up to max_batches); the plan stays empty.
  } else if (!named.empty()) {
    for (size_t i = 0; i < named.size(); ++i) plan.push_back({i, {-2, -2}});
  } else if (files.size() == 1 && !fs::is_directory(o.data)) {
    Tensor all = io::read_npy(files[0]);
    if (all.shape().empty()) throw Error(ErrorKind::kInvalidArgument, files[0] + " holds a scalar, not a batch");
    for (int64_t r = 0; r < all.shape()[0]; r += o.batch) plan.push_back({0, {r, std::min(all.shape()[0], r + o.batch)}});
  } else {
    for (size_t i = 0; i < files.size(); ++i) plan.push_back({i, {-1, -1}});
  }
  if (o.max_batches > 0 && static_cast<size_t>(o.max_batches) < plan.size()) plan.resize(static_cast<size_t>(o.max_batches));

  Tensor whole;
  size_t loaded = files.size();
  size_t batches = 0;
  for (size_t b = 0; o.next_batch ? (o.max_batches <= 0 || b < static_cast<size_t>(o.max_batches)) : b < plan.size(); ++b) {
    Tensor batch;
    const size_t file = o.next_batch ? 0 : plan[b].first;
    const std::pair<int64_t, int64_t> rows = o.next_batch ? std::pair<int64_t, int64_t>{-3, -3} : plan[b].second;
    if (rows.first == -3) {
      if (!o.next_batch(batch)) break;
      if (batch.shape().empty())
        throw Error(ErrorKind::kInvalidArgument, "calibration batch " + std::to_string(b + 1) + " of " + o.data + " is a scalar, not a batch");
    } else if (rows.first == -2) {
      batch = named[file];
    } else if (rows.first < 0) {
      batch = io::read_npy(files[file]);
    } else {
      if (loaded != file) whole = io::read_npy(files[file]), loaded = file;
      batch = slice_rows(whole, rows.first, rows.second);
    }
    if (batch.dtype() != input.dtype)
      throw Error(ErrorKind::kInvalidArgument, "calibration batch " + (files.empty() ? o.data : files[file]) + " is " + to_string(batch.dtype()) +
                                                   "; input '" + input.name + "' takes " + to_string(input.dtype));
    if (!engine) {
      if (o.device == Device::kCuda) build.input_shapes[input.name] = batch.shape();  // GPU engines have fixed shapes
      engine.emplace(Engine::from_onnx(model_path, build));
      engine_shape = batch.shape();
#if KILN_WITH_CUDA
      if (o.device == Device::kCuda) {
        context.emplace(engine->create_context());
        std::vector<std::string> floats;
        for (const TensorDesc& out : engine->outputs())
          if (out.dtype == DType::kFloat32) floats.push_back(out.name);
        gpu_histograms = std::make_unique<GpuHistogramCollector>(*context, input.name, floats);
      }
#endif
    } else if (o.device == Device::kCuda && batch.shape() != engine_shape) {
      ++skipped;  // a last, shorter batch: the GPU engine's shape is fixed
      continue;
    }
    std::map<std::string, Tensor> outputs;
#if KILN_WITH_CUDA
    // On the GPU, the activations never leave the device (abs_histogram.h); the input is
    // on the host already.
    if (gpu_histograms) gpu_histograms->add_batch(batch, histograms);
    else outputs = engine->run({{input.name, batch}});
#else
    outputs = engine->run({{input.name, batch}});
#endif
    outputs.emplace(input.name, batch);
    // One histogram per tensor, filled in parallel (each tensor's by one thread).
    std::vector<std::pair<AbsHistogram*, const Tensor*>> work;
    for (const auto& [name, t] : outputs)
      if (t.dtype() == DType::kFloat32) work.push_back({&histograms[name], &t});
    std::string failure;
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < work.size(); ++i) {
      try {
        work[i].first->add(work[i].second->data<float>(), work[i].second->numel());
      } catch (const Error& e) {
#pragma omp critical
        failure = e.what();
      }
    }
    if (!failure.empty()) throw Error(ErrorKind::kInvalidArgument, failure);
    ++batches;
    if (o.progress) o.progress(b + 1, plan.size(), histograms.size());
  }
  if (batches == 0) throw Error(ErrorKind::kInvalidArgument, "no calibration batches in " + o.data);

  CalibrationResult result;
  result.cache.model_fingerprint = model_fingerprint(read_file(model_path));
  result.cache.algorithm = to_string(o.algorithm);
  result.cache.batches = static_cast<int>(batches);  // skipped batches were not counted
  result.skipped_batches = skipped;
  for (const auto& [name, h] : histograms) {
    const double threshold = calibration_threshold(h, o.algorithm, o.percentile);
    if (threshold <= 0) {
      ++result.all_zero;  // never nonzero: nothing to scale
      continue;
    }
    result.cache.scales[name] = static_cast<float>(threshold / 127.0);
  }
  return result;
}

}  // namespace kiln::calibration
