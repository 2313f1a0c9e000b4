// Calibrating a model (see calibrate_model.h).
#include "calibration/calibrate_model.h"

#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "kiln/kiln.h"
#if KILN_WITH_CUDA
#include "calibration/abs_histogram.h"
#endif
#include "cpu/parallel.h"

namespace kiln::calibration {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, "cannot read " + path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

CalibrationResult calibrate_model(const std::string& model_path, const CalibrationOptions& o) {
  // The model's inputs, from the model itself: a GPU engine is built at the first batch's shapes.
  const std::vector<TensorDesc> inputs = model_inputs(model_path);
  CalibrationData data(inputs, o);
  BuildOptions build;
  build.mark_outputs = {"all"};  // every layer's output (of the optimized graph: the names INT8 builds look up)
  build.device = o.device;
  build.gpu = o.gpu;
  build.precision = Precision::kFp32;  // the activations of the float model
  std::optional<Engine> engine;
#if KILN_WITH_CUDA
  std::optional<Context> context;
  std::unique_ptr<GpuHistogramCollector> gpu_histograms;  // GPU engines: histograms on the device
#endif
  std::map<std::string, std::vector<int64_t>> engine_shapes;
  int skipped = 0;

  std::map<std::string, AbsHistogram> histograms;
  size_t batches = 0;
  Feeds batch;
  for (size_t b = 0; data.next(batch); ++b) {
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& [name, t] : batch) shapes[name] = t.shape();
    if (!engine) {
      if (o.device == Device::kCuda) build.input_shapes = shapes;  // GPU engines have fixed shapes
      engine.emplace(Engine::from_onnx(model_path, build));
      engine_shapes = shapes;
#if KILN_WITH_CUDA
      if (o.device == Device::kCuda) {
        context.emplace(engine->create_context());
        std::vector<std::string> floats;
        for (const TensorDesc& out : engine->outputs())
          if (out.dtype == DType::kFloat32) floats.push_back(out.name);
        gpu_histograms = std::make_unique<GpuHistogramCollector>(*context, floats, o.gpu);
      }
#endif
    } else if (o.device == Device::kCuda && shapes != engine_shapes) {
      ++skipped;  // a last, shorter batch: the GPU engine's shapes are fixed
      continue;
    }
    std::map<std::string, Tensor> outputs;
#if KILN_WITH_CUDA
    // On the GPU, the activations never leave the device (abs_histogram.h); the inputs are
    // on the host already.
    if (gpu_histograms) gpu_histograms->add_batch(batch, histograms);
    else outputs = engine->run(batch);
#else
    outputs = engine->run(batch);
#endif
    for (const auto& [name, t] : batch) outputs.emplace(name, t);
    // One histogram per tensor, filled in parallel (each tensor's by one thread).
    std::vector<std::pair<AbsHistogram*, const Tensor*>> work;
    for (const auto& [name, t] : outputs)
      if (t.dtype() == DType::kFloat32) work.push_back({&histograms[name], &t});
    try {
      cpu::parallel_for_each(static_cast<int64_t>(work.size()), true, [&](int64_t i) {
        const auto& [histogram, tensor] = work[static_cast<size_t>(i)];
        histogram->add(tensor->data<float>(), tensor->numel());
      }, 1);
    } catch (const Error& e) {
      throw Error(ErrorKind::kInvalidArgument, e.what());
    }
    ++batches;
    if (o.progress) o.progress(b + 1, data.size(), histograms.size());
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
