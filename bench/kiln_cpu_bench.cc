// kiln_cpu_bench: times kiln's CPU engine on one ONNX model or CPU engine file.
//
//   kiln_cpu_bench model.onnx|model.engine [--batch N] [--runs N] [--warmup N] [--threads N]
//                  [--no-fuse] [--no-optimize] [--dump-output file.bin] [--input file.bin]
//                  [--isa avx2|avx-vnni|avx512|plain]
//
// Imports the model, runs compiler::optimize (unless --no-optimize), builds cpu::CpuEngine,
// feeds every input random float32 data (seed 0; symbolic dims take --batch) or the raw
// float32 contents of --input, times --runs runs after --warmup and prints one JSON object.
// An engine file (a CPU engine `kiln build` wrote: an INT8 one, say) is loaded as it is and fed
// the same way. --dump-output writes the first output's raw float32 values, so a script can
// compare them with another runtime on the same input. --threads sets the CPU engine's threads
// (default: the CPUs the process may run on). --isa runs the kernels that follow sgemm_isa()
// and the int8 GEMM (cpu/int8_gemm.h) as on a CPU with that instruction set (at most the best
// this CPU has), to time the AVX2 paths on an AVX-512 machine; avx-vnni is AVX2 with the int8
// GEMM of AVX-VNNI CPUs (on an AVX-512 VNNI CPU, its EVEX twin).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cpu/engine.h"
#include "cpu/int8_gemm.h"
#include "cpu/parallel.h"
#include "cpu/sgemm.h"
#include "onnx/importer.h"
#include "compiler/pipeline.h"
#include "kiln/kiln.h"
#include "passes/passes.h"

namespace {

int usage() {
  std::cerr << "usage: kiln_cpu_bench model.onnx|model.engine [--batch N] [--runs N] [--warmup N] [--threads N] [--no-fuse]"
               " [--no-optimize] [--dump-output file.bin] [--input file.bin] [--isa avx2|avx-vnni|avx512|plain]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string model = argv[1];
  int64_t batch = 1;
  int runs = 50, warmup = 5;
  bool optimize = true, fuse = true;
  std::string dump, input_file;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--batch") batch = std::stoll(value());
      else if (a == "--runs") runs = std::stoi(value());
      else if (a == "--warmup") warmup = std::stoi(value());
      else if (a == "--threads") kiln::cpu::set_thread_count(std::stoi(value()));
      else if (a == "--isa") {
        const std::string isa = value();
        const kiln::cpu::SgemmIsa want = isa == "avx512" ? kiln::cpu::SgemmIsa::kAvx512
                                         : isa == "avx2" || isa == "avx-vnni" ? kiln::cpu::SgemmIsa::kAvx2
                                         : isa == "plain" ? kiln::cpu::SgemmIsa::kPlain
                                                          : throw std::invalid_argument("--isa " + isa);
        if (want > kiln::cpu::sgemm_best_isa()) {
          std::cerr << "kiln_cpu_bench: this CPU has no " << isa << "\n";
          return 2;
        }
        kiln::cpu::sgemm_force_isa(want);
        const kiln::cpu::Int8GemmIsa int8 = isa == "avx512"     ? kiln::cpu::int8_gemm_best_isa()
                                            : isa == "avx-vnni" ? kiln::cpu::Int8GemmIsa::kAvxVnni
                                            : isa == "avx2"     ? kiln::cpu::Int8GemmIsa::kAvx2
                                                                : kiln::cpu::Int8GemmIsa::kNone;
        if (int8 > kiln::cpu::int8_gemm_best_isa()) {
          std::cerr << "kiln_cpu_bench: this CPU has no " << isa << "\n";
          return 2;
        }
        kiln::cpu::int8_gemm_force_isa(int8);
      }
      else if (a == "--no-fuse") fuse = false;
      else if (a == "--no-optimize") optimize = false;
      else if (a == "--dump-output") dump = value();
      else if (a == "--input") input_file = value();
      else return usage();
    } catch (const std::exception& e) {
      std::cerr << "kiln_cpu_bench: " << e.what() << "\n";
      return usage();
    }
  }
  if (runs < 1) return usage();
  try {
    // The inputs to feed, the first output's name, and a run: from the ONNX model through the
    // passes, or from the engine file as it is.
    std::vector<kiln::TensorDesc> inputs;
    std::string first_output;
    std::map<std::string, int> op_counts;
    size_t nodes = 0;
    std::function<std::map<std::string, kiln::Tensor>(const std::map<std::string, kiln::Tensor>&)> run;
    const bool engine_file = model.size() > 7 && model.compare(model.size() - 7, 7, ".engine") == 0;
    if (engine_file) {
      auto engine = std::make_shared<kiln::Engine>(kiln::Engine::load(model));
      if (engine->backend() != "cpu") throw kiln::Error(kiln::ErrorKind::kUnsupported, "not a CPU engine").file(model);
      inputs = engine->inputs();
      first_output = engine->outputs().at(0).name;
      nodes = engine->layer_count();
      run = [engine](const std::map<std::string, kiln::Tensor>& feed) { return engine->run(feed); };
    } else {
      kiln::ir::Graph graph = kiln::onnx_import::import_file(model);
      if (optimize) {
        kiln::compiler::PassOptions options;
        options.fuse = fuse;
        kiln::compiler::optimize(graph, options);
      }
      for (const auto& n : graph.nodes) op_counts[(n.domain.empty() ? "" : n.domain + "::") + n.op]++;
      for (const std::string& name : graph.inputs) {
        const kiln::ir::TensorType& t = graph.value(name).type;
        if (!t.shape) throw kiln::Error(kiln::ErrorKind::kUnsupported, "input '" + name + "' has no known rank");
        kiln::TensorDesc desc{name, t.dtype, {}, {}};
        for (const kiln::ir::Dim& d : *t.shape) desc.shape.push_back(d.known() ? d.value : -1);
        inputs.push_back(desc);
      }
      auto engine = std::make_shared<kiln::cpu::CpuEngine>(std::move(graph));
      first_output = engine->graph().outputs.at(0);
      nodes = engine->graph().nodes.size();
      run = [engine](const std::map<std::string, kiln::Tensor>& feed) { return engine->run(feed); };
    }

    std::map<std::string, kiln::Tensor> feed;
    std::mt19937 rng(0);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    for (const kiln::TensorDesc& in : inputs) {
      if (in.dtype != kiln::DType::kFloat32)
        throw kiln::Error(kiln::ErrorKind::kUnsupported, "input '" + in.name + "' is not a float32 tensor");
      std::vector<int64_t> shape;
      for (int64_t d : in.shape) shape.push_back(d >= 0 ? d : batch);
      kiln::Tensor x(kiln::DType::kFloat32, shape);
      if (!input_file.empty()) {
        std::ifstream f(input_file, std::ios::binary);
        if (!f.read(static_cast<char*>(x.raw()), static_cast<std::streamsize>(x.nbytes())))
          throw kiln::Error(kiln::ErrorKind::kIo, "cannot read " + std::to_string(x.nbytes()) + " bytes of input")
              .file(input_file);
      } else {
        for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);
      }
      feed[in.name] = x;
    }

    std::map<std::string, kiln::Tensor> result;
    for (int i = 0; i < warmup; ++i) result = run(feed);
    std::vector<double> ms;
    for (int i = 0; i < runs; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      result = run(feed);
      auto t1 = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    if (!dump.empty()) {
      const kiln::Tensor& y = result.at(first_output);
      kiln::Tensor yf = y.to_float32();
      std::ofstream f(dump, std::ios::binary);
      f.write(static_cast<const char*>(yf.raw()), static_cast<std::streamsize>(yf.nbytes()));
      if (!f) throw kiln::Error(kiln::ErrorKind::kIo, "cannot write the output").file(dump);
    }
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    double mean = 0;
    for (double v : ms) mean += v;
    mean /= static_cast<double>(ms.size());
    auto pct = [&](double p) {
      size_t idx = static_cast<size_t>(p * static_cast<double>(sorted.size() - 1) + 0.5);
      return sorted[std::min(idx, sorted.size() - 1)];
    };
    nlohmann::json out;
    out["model"] = model;
    out["batch"] = batch;
    out["runs"] = runs;
    out["warmup"] = warmup;
    out["optimized"] = optimize || engine_file;
    out["fused"] = (optimize && fuse) || engine_file;
    out["threads"] = kiln::cpu::thread_count();
    out["median_ms"] = pct(0.5);
    out["mean_ms"] = mean;
    out["p90_ms"] = pct(0.9);
    out["min_ms"] = sorted.front();
    out["nodes"] = nodes;
    out["op_counts"] = op_counts;
    out["times_ms"] = ms;
    std::cout << out.dump() << std::endl;
  } catch (const kiln::Error& e) {
    std::cerr << "kiln_cpu_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
