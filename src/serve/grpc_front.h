// kiln serve's native gRPC front: the Open Inference Protocol's gRPC service (inference.proto) in
// C++, so that a request reaches the engine without Python. It decodes each request into tensors
// (the request's own bytes, or a registered shared-memory region), queues it on its model's
// Batcher, and writes the outputs into the answer (or into the region the request names) on the
// thread that ran the batch. What it serves: health, server and model metadata, ModelInfer,
// ModelStreamInfer (answers in the order sent, while later requests already run) and the system
// shared-memory extension. The Python side of kiln serve loads the models (engines built and
// warmed), serves HTTP through KServe, and hands the engines' runs to this front.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/types.h"
#include "serve/batcher.h"
#include "serve/shared_memory_regions.h"

namespace kiln::serve {

struct ServedModel {
  std::string name;
  std::string version;  // "" when the model has none; a request naming another version is refused
  std::vector<TensorDesc> inputs;
  std::vector<TensorDesc> outputs;
  std::vector<Runner> runners;
  BatchingOptions batching;  // max_batch 1 for a model whose first dimension is not a batch
};

struct FrontOptions {
  std::string address = "127.0.0.1:8001";  // host:port; port 0 picks a free one (see GrpcFront::port)
  uint64_t max_request_bytes = uint64_t{1} << 30;  // the inputs of one request, wherever they lie
  // >= 0: registered shared memory is pinned for this GPU, and GPU models' inputs in the message are
  // copied into page-locked buffers (pinned_input_bytes of them at most; 0: none) as requests arrive
  int pin_gpu = -1;
  uint64_t pinned_input_bytes = uint64_t{1} << 30;
  std::string server_version;
};

// What run() throws for a request the model's batcher does not take now (--max-queue requests
// already waiting, or the front shutting down): the caller may try again (HTTP 503).
class Unavailable : public Error {
 public:
  explicit Unavailable(std::string message) : Error(ErrorKind::kInvalidArgument, std::move(message)) {}
};

// A model's requests and errors as the front counted them, and its batcher's counters.
struct ModelStats {
  uint64_t requests = 0;
  uint64_t errors = 0;
  BatcherStats batching;
};

class GrpcFront {
 public:
  // Starts serving. Throws kiln::Error naming the address when it cannot listen there, or the
  // model at fault (no runner, two models of one name).
  GrpcFront(std::vector<ServedModel> models, FrontOptions options);
  // shutdown(), if not yet done.
  ~GrpcFront();
  GrpcFront(const GrpcFront&) = delete;
  GrpcFront& operator=(const GrpcFront&) = delete;

  int port() const;
  // Refuses new calls and waits until the calls in flight are answered (their batches run),
  // at most `grace_seconds`, after which the rest are cancelled.
  void shutdown(double grace_seconds = 30);
  std::map<std::string, ModelStats> stats() const;
  // One request from another front (kiln serve's HTTP one) through the model's batcher: inputs
  // already checked against the model, of `rows` rows. Waits; returns the request's rows of every
  // output (copies). Throws kiln::Error naming the model when it is unknown or the run fails, and
  // Unavailable when its batcher does not take the request.
  Tensors run(const std::string& model, Tensors inputs, int64_t rows);
  // Adds to a model's counts what another front's requests cost that run() did not see: a
  // request refused before it reached run() (1 request, 1 error), or one whose answer failed
  // after run() returned (0, 1). stats() then counts each request of both fronts once.
  void count(const std::string& model, uint64_t requests, uint64_t errors);
  // The shared-memory regions clients registered over gRPC; kiln serve's HTTP front registers
  // and reads its clients' regions here too, so a region serves both protocols.
  SharedMemoryRegions& shared_memory();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::serve
