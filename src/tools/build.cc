// kiln build model.onnx --fp16 -o model.engine: builds a GPU engine (tactics timed on this
// GPU) and writes the engine file; prints what it chose and the memory it needs.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>

#include "compiler/data_dependent_split.h"
#include "tools/commands.h"
#include "tools/engine_options.h"

namespace kiln::tools {

namespace {

struct BuildCommandOptions {
  std::string model;
  std::string output;
  EngineOptions engine;
};

void print_summary(const Engine& engine) {
  EngineInfo info = engine.info();
  std::map<std::string, int> ops;
  int fallback = 0;
  for (const LayerInfo& l : info.layers) {
    ++ops[l.op];
    fallback += l.cpu_fallback && l.tactic == "cpu-fallback";
  }
  std::cout << fmt::format("engine: {} layers on {} ({}), precision {}\n", info.layers.size(), info.device, info.backend,
                           info.precision);
  std::string list;
  for (const auto& [op, n] : ops) list += fmt::format("{}{} x{}", list.empty() ? "" : ", ", op, n);
  std::cout << "  layers: " << list << "\n";
  std::cout << fmt::format("  memory: weights {}, activations {}, workspace {}\n", format_bytes(static_cast<double>(info.weight_bytes)),
                           format_bytes(static_cast<double>(info.activation_bytes)),
                           format_bytes(static_cast<double>(info.workspace_bytes)));
  if (!info.fp32_layers.empty()) {
    std::cout << fmt::format("  {} layer(s) kept float32 in this fp16 build:", info.fp32_layers.size());
    for (const std::string& l : info.fp32_layers) std::cout << " " << l;
    std::cout << "\n";
  }
  if (info.precision == "int8") {
    std::cout << fmt::format("  {} convolution(s) kept in float in this INT8 build{}\n", info.int8_kept_float.size(),
                             info.int8_kept_float.empty() ? "" : ":");
    for (const std::string& l : info.int8_kept_float) std::cout << "    " << l << "\n";
  }
  if (fallback) {
    std::cout << fmt::format("  {} layer(s) run on the CPU engine (no GPU layer; --strict refuses them):", fallback);
    for (const LayerInfo& l : info.layers)
      if (l.cpu_fallback && l.tactic == "cpu-fallback") std::cout << fmt::format(" {} ({})", l.name, l.op);
    std::cout << "\n";
  }
  if (!info.data_dependent_nodes.empty()) {
    const auto after = std::count_if(info.layers.begin(), info.layers.end(),
                                     [](const LayerInfo& l) { return l.cpu_fallback && l.tactic != "cpu-fallback"; });
    std::cout << fmt::format("  {} layer(s) run on the CPU engine after the GPU's part, from {} on (output shapes that "
                             "depend on the data; --strict refuses them)\n", after,
                             compiler::named_nodes(info.data_dependent_nodes));
  }
  for (const TensorDesc& d : engine.inputs())
    std::cout << fmt::format("  input  '{}': {} [{}]\n", d.name, to_string(d.dtype), shape_to_string(d.shape));
  for (const TensorDesc& d : engine.outputs())
    std::cout << fmt::format("  output '{}': {} [{}]\n", d.name, to_string(d.dtype), shape_to_string(d.shape));
  for (size_t p = 0; p < info.profiles.size(); ++p) {
    const ProfileInfo& pi = info.profiles[p];
    bool dynamic = false;
    for (const auto& [name, r] : pi.ranges) dynamic |= r.min != r.max;
    if (!dynamic) continue;
    std::cout << fmt::format("  profile {}:", p);
    for (const auto& [name, r] : pi.ranges)
      if (r.min != r.max)
        std::cout << fmt::format(" {} min {} opt {} max {};", name, shape_to_string(r.min), shape_to_string(r.opt),
                                 shape_to_string(r.max));
    std::cout << fmt::format(" activations at max {}\n", format_bytes(static_cast<double>(pi.activation_bytes)));
  }
}

int build(const BuildCommandOptions& o) {
  std::vector<std::string> defaulted;
  BuildOptions options = o.engine.build_options(o.model, defaulted);
  if (!defaulted.empty() && options.device == Device::kCuda) {
    std::string list;
    for (const std::string& d : defaulted) list += (list.empty() ? "" : ", ") + d;
    std::cout << "note: dynamic dimensions set to 1: " << list << " (choose with --batch, --dim or --shapes)\n";
  }
  auto t0 = std::chrono::steady_clock::now();
  Engine engine = Engine::from_onnx(o.model, options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string out = o.output.empty() ? std::filesystem::path(o.model).replace_extension(".engine").string() : o.output;
  engine.save(out);
  print_summary(engine);
  std::cout << fmt::format("built in {:.2f} s; wrote {} ({})\n", seconds, out,
                           format_bytes(static_cast<double>(std::filesystem::file_size(out))));
  return 0;
}

}  // namespace

void add_build_command(CLI::App& app, std::function<int()>& action) {
  auto o = std::make_shared<BuildCommandOptions>();
  CLI::App* cmd = app.add_subcommand("build", "Build an engine (GPU, or CPU with --device cpu) from an ONNX model and write the engine file");
  add_model_option(cmd, o->model, false);
  cmd->add_option("-o,--output,--saveEngine", o->output, "Engine file to write (default: the model's name with .engine)");
  o->engine.add_to(cmd, "cuda");
  cmd->callback([o, cmd, &action] {
    action = [o, cmd] {
      check_model_option(cmd, o->model);
      return build(*o);
    };
  });
}

}  // namespace kiln::tools
