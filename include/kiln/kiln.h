// kiln: compile ONNX models into inference engines and run them.
//
// This is the header a user reads first. A typical program:
//
//   kiln::Engine engine = kiln::Engine::from_onnx("resnet50.onnx");
//   kiln::Tensor image(kiln::DType::kFloat32, {1, 3, 224, 224});
//   auto outputs = engine.run({{"input", image}});
//
// Every function throws kiln::Error (see error.h) on failure, never anything else.
// Thread safety: an Engine may be shared between threads, but run() must be called from one
// thread at a time (kernels keep scratch buffers); execution contexts come with dynamic shapes.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

// An input or output of a model. A dimension of -1 is dynamic; dim_names[i] then holds its
// symbolic name ("batch"), if the model gave one.
struct TensorDesc {
  std::string name;
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;
  std::vector<std::string> dim_names;
};

struct BuildOptions {
  bool optimize = true;  // run kiln's graph passes (constant folding, BatchNorm folding, fusion)
};

class Engine {
 public:
  // Imports an ONNX model, optimizes it and builds an engine for the CPU.
  static Engine from_onnx(const std::string& onnx_path, const BuildOptions& options = {});

  const std::vector<TensorDesc>& inputs() const;
  const std::vector<TensorDesc>& outputs() const;
  // "cpu" (the GPU engine arrives with the CUDA backend).
  std::string backend() const;
  // Number of layers after optimization.
  size_t layer_count() const;

  // Runs the model. Every input must be given, with the declared dtype and a shape that
  // matches the declared one (dynamic dimensions may take any value, consistently).
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& inputs) const;

 private:
  struct Impl;
  explicit Engine(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kiln
