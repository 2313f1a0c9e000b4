// libFuzzer target: the ModelInfer messages of kiln serve's native gRPC front
// (src/serve/infer_messages.h), what a client controls byte for byte. The bytes are a
// ModelInferRequest in protobuf's wire format; one that parses is decoded against a served model
// (x: FP32 [-1, 4], ids: INT64 [-1, 2]; y: FP32 [-1, 3] and n: INT64 [-1] out) with one
// registered shared-memory region ("r0", 1,024 bytes of a 4,096-byte object from byte 64). A
// request that decodes is answered from a batch in which its rows follow another request's, so
// that every output row and region write of the answer is reached too. Either step may refuse
// the request (Refusal); nothing else may happen: no crash, no sanitizer report, no tensor that
// disagrees with its shape, no answer that disagrees with the rows asked for.
//   build-fuzz/fuzz/fuzz_infer_request -max_total_time=600 build-fuzz/fuzz/corpus_infer
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "kiln/error.h"
#include "kiln/tensor.h"
#include "serve/infer_messages.h"

namespace {

using kiln::DType;
using kiln::Tensor;
using kiln::serve::BatchResult;
using kiln::serve::RequestInputs;
using kiln::serve::ServedModel;
using kiln::serve::SharedMemoryRegions;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_infer_request: %s\n", what.c_str());
  std::abort();
}

kiln::TensorDesc desc(std::string name, DType dtype, std::vector<int64_t> shape) {
  kiln::TensorDesc d;
  d.name = std::move(name);
  d.dtype = dtype;
  d.shape = std::move(shape);
  return d;
}

ServedModel served_model() {
  ServedModel m;
  m.name = "m";
  m.inputs = {desc("x", DType::kFloat32, {-1, 4}), desc("ids", DType::kInt64, {-1, 2})};
  m.outputs = {desc("y", DType::kFloat32, {-1, 3}), desc("n", DType::kInt64, {-1})};
  m.batching.max_batch = 8;
  return m;
}

// One region, "r0", in an object of this process's own (unlinked once mapped).
SharedMemoryRegions& regions() {
  static SharedMemoryRegions* r = [] {
    auto* made = new SharedMemoryRegions();
    const std::string key = "/kiln_fuzz_infer_" + std::to_string(getpid());
    const int fd = shm_open(key.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, 4096) != 0) fail("cannot make the shared-memory object " + key);
    close(fd);
    made->register_region("r0", key, 64, 1024);
    shm_unlink(key.c_str());
    return made;
  }();
  return *r;
}

int64_t checked_numel(const Tensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape()) {
    if (d < 0) fail("a decoded tensor has a negative dimension");
    n *= d;
  }
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // (a line per parsed string that is not UTF-8 otherwise)
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto request = std::make_shared<inference::ModelInferRequest>();
  if (size > (1u << 20) || !request->ParseFromArray(data, static_cast<int>(size))) return 0;
  static const ServedModel model = served_model();
  RequestInputs in;
  try {
    in = kiln::serve::decode_request(*request, model, regions(), 1 << 16, request);
  } catch (const kiln::serve::Refusal&) {
    return 0;
  }
  // Every byte of every input is read: a tensor over memory it does not own is ASan's to see.
  unsigned sum = 0;
  for (const auto& [name, t] : in.inputs) {
    if (checked_numel(t) != t.numel() || t.nbytes() != static_cast<size_t>(t.numel()) * kiln::element_size(t.dtype()))
      fail("input '" + name + "' disagrees with its shape");
    if (t.rank() == 0 || t.dim(0) != in.rows) fail("input '" + name + "' does not have the request's rows");
    const auto* bytes = static_cast<const unsigned char*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i) sum += bytes[i];
  }
  if (in.inputs.size() != 2 || in.rows < 0 || in.rows > model.batching.max_batch)
    fail("a request decoded that the model does not take");

  // A batch of another request's row, then this one's, then one zero row of padding.
  const int64_t batch = in.rows + 2;
  kiln::serve::Tensors outputs;
  Tensor y = Tensor::uninitialized(DType::kFloat32, {batch, 3});
  Tensor n = Tensor::uninitialized(DType::kInt64, {batch});
  for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = static_cast<float>(i + sum % 7);
  for (int64_t i = 0; i < n.numel(); ++i) n.data<int64_t>()[i] = i;
  outputs.emplace("y", y);
  outputs.emplace("n", n);
  BatchResult result;
  result.outputs = &outputs;
  result.first_row = 1;
  result.rows = in.rows;
  inference::ModelInferResponse response;
  try {
    kiln::serve::write_answer(*request, model, regions(), result, &response);
  } catch (const kiln::serve::Refusal&) {
    return 0;
  }
  if (response.outputs_size() != response.raw_output_contents_size())
    fail("the answer's outputs and raw contents disagree in number");
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& out = response.outputs(i);
    if (out.shape_size() < 1 || out.shape(0) != in.rows) fail("output '" + out.name() + "' does not have the request's rows");
    const size_t row_bytes = out.name() == "y" ? 3 * sizeof(float) : sizeof(int64_t);
    const size_t bytes = static_cast<size_t>(in.rows) * row_bytes;
    const bool in_region = out.parameters().count("shared_memory_region") > 0;
    if (response.raw_output_contents(i).size() != (in_region ? 0 : bytes))
      fail("output '" + out.name() + "' holds " + std::to_string(response.raw_output_contents(i).size()) + " bytes");
    if (!in_region && bytes && std::memcmp(response.raw_output_contents(i).data(),
                                           static_cast<const unsigned char*>(outputs.at(out.name()).raw()) + row_bytes,
                                           bytes) != 0)
      fail("output '" + out.name() + "' is not the request's rows");
  }
  return 0;
}
