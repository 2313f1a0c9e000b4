// Builds a CPU engine from an ONNX model, saves it, loads it back and runs both on one input:
// the loaded engine must give the built one's outputs bit for bit.
//
//   kiln_example model.onnx model.engine
#include <kiln/kiln.h>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL.onnx OUT.engine\n", argv[0]);
    return 2;
  }
  try {
    kiln::Engine built = kiln::Engine::from_onnx(argv[1]);  // the CPU engine: kiln::BuildOptions{}
    built.save(argv[2]);
    kiln::Engine loaded = kiln::Engine::load(argv[2]);

    // One input of the declared shape (dynamic dimensions as 1), filled with a ramp in [0, 1).
    std::map<std::string, kiln::Tensor> inputs;
    for (const kiln::TensorDesc& desc : loaded.inputs()) {
      std::vector<int64_t> shape = desc.shape;
      for (int64_t& d : shape) d = d < 0 ? 1 : d;
      kiln::Tensor tensor(kiln::DType::kFloat32, shape);
      float* data = tensor.data<float>();
      for (int64_t i = 0; i < tensor.numel(); ++i) data[i] = static_cast<float>(i % 97) / 97.0f;
      inputs.emplace(desc.name, tensor);
    }

    std::map<std::string, kiln::Tensor> want = built.run(inputs);
    std::map<std::string, kiln::Tensor> got = loaded.run(inputs);
    for (const auto& [name, tensor] : got) {
      const kiln::Tensor& expected = want.at(name);
      if (tensor.shape() != expected.shape() || std::memcmp(tensor.raw(), expected.raw(), tensor.nbytes()) != 0) {
        std::fprintf(stderr, "kiln_example: output '%s' of the loaded engine differs from the built engine's\n",
                     name.c_str());
        return 1;
      }
      std::printf("output '%s': %s [%s]", name.c_str(), kiln::to_string(tensor.dtype()).c_str(),
                  kiln::shape_to_string(tensor.shape()).c_str());
      if (tensor.dtype() == kiln::DType::kFloat32 && tensor.numel() > 0) {
        const float* v = tensor.data<float>();
        int64_t best = 0;
        for (int64_t i = 1; i < tensor.numel(); ++i) best = v[i] > v[best] ? i : best;
        std::printf(", largest at index %lld (%.4f)", static_cast<long long>(best), v[best]);
      }
      std::printf("\n");
    }
    std::printf("%s: built, saved to %s, loaded: same outputs (%s backend, %zu layers)\n", argv[1], argv[2],
                loaded.backend().c_str(), loaded.layer_count());
    return 0;
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln_example: %s\n", e.what());
    return 1;
  }
}
