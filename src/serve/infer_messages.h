// The Open Inference Protocol's ModelInfer messages (inference.proto) as kiln serve's native gRPC
// front reads and writes them: a request's inputs decoded and checked against its model, and the
// answer's outputs written. Apart from the service (grpc_front.cc) so that the fuzzer
// (fuzz/fuzz_infer_request.cc) reaches them without a server.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <memory>
#include <string>

#include "inference.pb.h"
#include "kiln/tensor.h"
#include "serve/batcher.h"
#include "serve/grpc_front.h"
#include "serve/shared_memory_regions.h"

namespace kiln::serve {

// A request the front answers with an error instead of running it: the status and its message.
struct Refusal {
  grpc::StatusCode code;
  std::string message;
};
[[noreturn]] void refuse(std::string message, grpc::StatusCode code = grpc::StatusCode::INVALID_ARGUMENT);

struct RequestInputs {
  Tensors inputs;
  int64_t rows = 1;  // the inputs' first dimension (1 for inputs without one)
};

// The request's inputs as tensors, checked against the model: their names, datatypes, shapes and
// sizes (max_request_bytes in all), the regions they name. Raw contents are used in place (`keep`
// keeps the request's bytes alive as long as a tensor), as is a region's memory; typed contents
// are copied. Throws Refusal (INVALID_ARGUMENT) saying what is wrong.
RequestInputs decode_request(const inference::ModelInferRequest& request, const ServedModel& model,
                             const SharedMemoryRegions& regions, uint64_t max_request_bytes,
                             const std::shared_ptr<const void>& keep);

// The request's rows of a batch's outputs (result.first_row, result.rows), each output it asks
// for (all when it names none), in `response` or in the region a requested output names. Throws
// Refusal: INTERNAL for the batch's error or an output the engine did not give, INVALID_ARGUMENT
// for a region that cannot hold an output.
void write_answer(const inference::ModelInferRequest& request, const ServedModel& model,
                  const SharedMemoryRegions& regions, const BatchResult& result, inference::ModelInferResponse* response);

// The protocol's name of a datatype ("FP32"); kiln's own for one it has none for.
std::string datatype_name(DType dtype);
// Rows [first, first + count) of a batch's output as a tensor of their own (the output itself
// when they are all of it).
Tensor rows_of(const Tensor& all, int64_t first, int64_t count);

}  // namespace kiln::serve
