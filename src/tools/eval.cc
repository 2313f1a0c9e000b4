// kiln eval MODEL --dataset fashion-mnist: accuracy on real data. Runs the 10k test split
// (Debian's dataset-fashion-mnist) through an engine built with the usual options (--device,
// --fp16, --int8 --calib ..., or an engine file) and prints top-1, top-5 and the top-1
// agreement with the float32 model on the CPU engine (for an engine file: --reference
// MODEL.onnx), with a progress bar.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "io/idx.h"
#include "kiln/kiln.h"
#include "tools/commands.h"
#include "tools/engine_options.h"
#include "tools/json_output.h"

namespace kiln::tools {

namespace {

struct EvalOptions {
  std::string model;
  std::string dataset;
  std::string reference;
  std::string json;
  int64_t limit = 0;
  EngineOptions engine;
};

// Top-1 and whether the label is among the top 5, for one row of class scores.
void rank_row(const float* scores, int64_t classes, int64_t label, int64_t& top1, bool& in_top5) {
  top1 = 0;
  for (int64_t c = 1; c < classes; ++c)
    if (scores[c] > scores[top1]) top1 = c;
  int64_t above = 0;  // classes scoring higher than the label
  for (int64_t c = 0; c < classes; ++c) above += scores[c] > scores[label];
  in_top5 = above < 5;
}

// Throws unless the engine takes Fashion-MNIST's images: one float32 input [N, 1, 28, 28].
void check_input(const Engine& engine, const std::string& file) {
  const TensorDesc& in = engine.inputs().at(0);
  if (engine.inputs().size() != 1 || in.dtype != DType::kFloat32 || in.shape.size() != 4 || in.shape[1] != 1 ||
      in.shape[2] != 28 || in.shape[3] != 28)
    throw Error(ErrorKind::kInvalidArgument, "Fashion-MNIST feeds float32 [N, 1, 28, 28] images; input '" + in.name + "' is " +
                                                 to_string(in.dtype) + " [" + shape_to_string(in.shape) + "]" +
                                                 (engine.inputs().size() != 1 ? " (and the model has other inputs)" : ""))
        .file(file);
}

// The fewest rows the engine runs: a fixed batch, or the smallest batch of its profiles.
int64_t smallest_batch(const Engine& engine) {
  const TensorDesc& in = engine.inputs().at(0);
  if (in.shape[0] > 0) return in.shape[0];
  int64_t least = 1;
  for (size_t p = 0; p < engine.profiles().size(); ++p) {
    const int64_t m = engine.profiles()[p].at(in.name).min[0];
    least = p == 0 ? m : std::min(least, m);
  }
  return least;
}

// Runs `engine` on images [begin, end), padded with zeros to the fewest rows it runs; returns the
// class scores (of the real rows first).
Tensor run_batch(const Engine& engine, const io::LabeledImages& data, int64_t begin, int64_t end) {
  const TensorDesc& in = engine.inputs().at(0);
  Tensor x = io::fashion_mnist_input(data, begin, end);
  const int64_t rows = end - begin, least = smallest_batch(engine);
  if (rows < least) {
    Tensor padded(DType::kFloat32, {least, 1, x.dim(2), x.dim(3)});
    std::copy(x.data<float>(), x.data<float>() + x.numel(), padded.data<float>());
    x = std::move(padded);
  }
  Tensor y = engine.run({{in.name, x}}).at(engine.outputs().at(0).name);
  if (y.dtype() != DType::kFloat32 || y.rank() != 2)
    throw Error(ErrorKind::kInvalidArgument, "kiln eval needs class scores [N, classes] from the first output; '" +
                                                 engine.outputs().at(0).name + "' is " + to_string(y.dtype()) + " [" +
                                                 shape_to_string(y.shape()) + "]");
  return y;
}

int eval(const EvalOptions& o) {
  const JsonOutput json(o.json);
  if (o.dataset != "fashion-mnist")
    throw Error(ErrorKind::kInvalidArgument, "unknown dataset '" + o.dataset + "'").hint("kiln eval knows: fashion-mnist");
  const io::LabeledImages test = io::load_fashion_mnist("test");
  const int64_t count = o.limit > 0 ? std::min(o.limit, test.images.dim(0)) : test.images.dim(0);

  EngineOptions eo = o.engine;
  if (eo.batch < 0) eo.batch = 256;
  std::optional<Engine> engine;
  std::string reference = o.reference;
  const bool engine_file = is_engine_file(o.model);
  if (engine_file) {
    engine.emplace(Engine::load(o.model, o.engine.load_options()));
  } else {
    std::vector<std::string> defaulted;
    engine.emplace(Engine::from_onnx(o.model, eo.build_options(o.model, defaulted)));
    if (reference.empty()) reference = o.model;
  }
  check_input(*engine, o.model);
  const TensorDesc& in = engine->inputs().at(0);
  int64_t batch = in.shape[0] > 0 ? in.shape[0] : eo.batch;
  if (in.shape[0] < 0 && !engine->profiles().empty()) {  // a dynamic GPU engine: its largest batch, at most --batch
    int64_t most = 0;
    for (const OptimizationProfile& p : engine->profiles()) most = std::max(most, p.at(in.name).max[0]);
    batch = std::min(batch, most);
  }
  const EngineInfo info = engine->info();
  // The float32 reference: the ONNX model on the CPU engine (the engine itself when it is that).
  std::optional<Engine> ref;
  const bool self_reference = !engine_file && o.reference.empty() && info.backend == "cpu" && info.precision == "fp32";
  if (!reference.empty() && !self_reference) {
    ref.emplace(Engine::from_onnx(reference));
    check_input(*ref, reference);
  }

  int64_t top1 = 0, top5 = 0, agree = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t b = 0; b < count; b += batch) {
    const int64_t e = std::min(count, b + batch);
    const Tensor y = run_batch(*engine, test, b, e);
    std::optional<Tensor> r;
    if (ref) r = run_batch(*ref, test, b, e);
    const int64_t classes = y.dim(1);
    for (int64_t i = 0; i < e - b; ++i) {
      const int64_t label = test.labels.data<uint8_t>()[b + i];
      int64_t pred = 0, ref_pred = 0;
      bool in5 = false, unused = false;
      rank_row(y.data<float>() + i * classes, classes, label, pred, in5);
      top1 += pred == label;
      top5 += in5;
      if (r) rank_row(r->data<float>() + i * classes, classes, label, ref_pred, unused);
      agree += r ? pred == ref_pred : 1;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int width = 30, done = static_cast<int>(width * e / count);
    std::fprintf(stderr, "\rkiln eval: [%s%s] %lld/%lld images, %.1f s", std::string(static_cast<size_t>(done), '#').c_str(),
                 std::string(static_cast<size_t>(width - done), ' ').c_str(), static_cast<long long>(e),
                 static_cast<long long>(count), s);
  }
  std::fprintf(stderr, "\n");
  const double n = static_cast<double>(count);
  const bool has_reference = self_reference || ref.has_value();
  std::cout << fmt::format("fashion-mnist test, {} images, {} on {} ({}):\n", count, info.precision, info.device, info.backend);
  std::cout << fmt::format("  top-1 {:.4f}  top-5 {:.4f}", top1 / n, top5 / n);
  if (has_reference) std::cout << fmt::format("  top-1 agreement with float32 {:.4f}", agree / n);
  else std::cout << "  (no float32 reference: give --reference MODEL.onnx)";
  std::cout << "\n";
  // What a quantized engine quantized: on the GPU `--int8`/`--fp8` keep layers in fp16 where
  // that timed faster, so the figures above are of this mix.
  const bool quantized = info.precision == "int8" || info.precision == "fp8";
  int64_t quantized_layers = 0;
  for (const LayerInfo& l : info.layers) quantized_layers += l.op == "QConv";
  if (quantized)
    std::cout << fmt::format("  {} convolutions in {}, {} kept in float (kiln inspect says why)\n", quantized_layers,
                             info.precision == "int8" ? "INT8" : "FP8", info.int8_kept_float.size());
  if (json.wanted()) {
    nlohmann::json j = {{"dataset", "fashion-mnist"}, {"split", "test"}, {"images", count}, {"model", o.model},
                        {"precision", info.precision}, {"device", info.device}, {"backend", info.backend},
                        {"top1", top1 / n}, {"top5", top5 / n}};
    if (has_reference) j["agreement_fp32"] = agree / n;
    if (quantized) {
      j["quantized_layers"] = quantized_layers;
      j["kept_float"] = info.int8_kept_float;
    }
    json.write(j);
  }
  return 0;
}

}  // namespace

void add_eval_command(CLI::App& app, std::function<int()>& action) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* cmd = app.add_subcommand("eval", "Accuracy on a dataset's test split: top-1, top-5, agreement with float32");
  cmd->add_option("model", o->model, "ONNX model or engine file")->required();
  cmd->add_option("--dataset", o->dataset, "fashion-mnist (Debian's dataset-fashion-mnist, the 10k test split)")->required();
  cmd->add_option("--limit", o->limit, "Only the first N test images")->check(CLI::PositiveNumber);
  cmd->add_option("--reference", o->reference, "The float32 ONNX model to compare an engine file with");
  cmd->add_option("--json", o->json, "Write the figures as JSON to FILE, or - for standard output");
  o->engine.add_to(cmd, "cpu");
  cmd->callback([o, &action] { action = [o] { return eval(*o); }; });
}

}  // namespace kiln::tools
