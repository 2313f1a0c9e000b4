// libFuzzer target: the bytes decoded into a well-formed ONNX model (graph_generator.h), which
// then goes where fuzz_onnx_import's inputs go: import, passes, the CPU engine and, when every
// shape is small, one run. Any exception but a kiln::Error of a kind a user can cause is a
// finding; so are crashes and sanitizer reports, in the generator's checks as anywhere.
//
// At exit it prints how far the models got (KILN_FUZZ_GRAPH_STATS=1: and the most common
// reasons for refusing a model or dropping a node, for tuning the generator). With
// KILN_FUZZ_GRAPH_SAVE=<path>, each model is written to <path> before it is exercised, so
// replaying one input (fuzz_graph crash-...) leaves its model there to read or to keep as a
// fuzz_onnx_import seed.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "exercise.h"
#include "graph_generator.h"

namespace {

struct Counts {
  uint64_t models = 0, ran = 0, built = 0, refused = 0;
  kiln::fuzz::GeneratorStats generator;
  std::map<std::string, uint64_t> reasons;
  bool verbose = false;

  Counts() {
    const char* v = std::getenv("KILN_FUZZ_GRAPH_STATS");
    verbose = v && std::string(v) == "1";
    if (verbose) generator.reasons = &reasons;
  }
  ~Counts() {
    if (!models) return;
    auto pct = [this](uint64_t n) { return 100.0 * static_cast<double>(n) / static_cast<double>(models); };
    std::fprintf(stderr,
                 "fuzz_graph: %llu models: %llu ran (%.1f%%), %llu built but not run (%.1f%%), %llu refused with "
                 "kiln::Error (%.1f%%); nodes: %llu kept, %llu dropped, %llu kept though refused\n",
                 static_cast<unsigned long long>(models), static_cast<unsigned long long>(ran), pct(ran),
                 static_cast<unsigned long long>(built), pct(built), static_cast<unsigned long long>(refused), pct(refused),
                 static_cast<unsigned long long>(generator.nodes_kept), static_cast<unsigned long long>(generator.nodes_dropped),
                 static_cast<unsigned long long>(generator.nodes_kept_invalid));
    if (!verbose) return;
    std::vector<std::pair<uint64_t, std::string>> top;
    for (const auto& [why, n] : reasons) top.emplace_back(n, why);
    std::sort(top.rbegin(), top.rend());
    for (size_t i = 0; i < top.size() && i < 40; ++i)
      std::fprintf(stderr, "  %8llu  %s\n", static_cast<unsigned long long>(top[i].first), top[i].second.c_str());
  }
};
Counts counts;

[[noreturn]] void internal_error(const kiln::Error& e) {
  std::fprintf(stderr, "kiln internal error: %s\n", e.what());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider provider(data, size);
  onnx::ModelProto model;
  try {
    model = kiln::fuzz::GraphGenerator<FuzzedDataProvider>(provider, &counts.generator).generate();
  } catch (const kiln::Error& e) {
    if (e.kind() == kiln::ErrorKind::kInternal) internal_error(e);
    throw;  // the generator's own checks swallow every other kiln::Error: this is a bug in it
  }
  ++counts.models;
  const std::string bytes = model.SerializeAsString();
  if (const char* save = std::getenv("KILN_FUZZ_GRAPH_SAVE")) std::ofstream(save, std::ios::binary) << bytes;
  try {
    if (kiln::fuzz::exercise_model(bytes)) ++counts.ran;
    else ++counts.built;
  } catch (const kiln::Error& e) {
    if (e.kind() == kiln::ErrorKind::kInternal) internal_error(e);
    ++counts.refused;
    if (counts.verbose) ++counts.reasons["model: " + std::string(e.what()).substr(0, 160)];
  }
  // Anything else escapes and libFuzzer reports it as a crash (uncaught exception).
  return 0;
}
