#include "serve/grpc_front.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <utility>

#include "inference.grpc.pb.h"
#include "kiln/error.h"
#include "kiln/tensor.h"
#include "serve/infer_messages.h"
#include "serve/pinned_inputs.h"
#include "serve/shared_memory_regions.h"

namespace kiln::serve {

namespace {

namespace pb = ::inference;

struct Model {
  ServedModel served;
  bool on_gpu = false;  // its runs are GPU contexts: inputs in the message are worth page-locking
  std::unique_ptr<Batcher> batcher;
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> errors{0};
};

}  // namespace

struct GrpcFront::Impl final : pb::GRPCInferenceService::CallbackService {
  FrontOptions options;
  std::map<std::string, std::unique_ptr<Model>> models;
  SharedMemoryRegions regions;
  std::unique_ptr<grpc::Server> server;
  int bound_port = 0;
  std::mutex shutdown_mutex;
  bool shut_down = false;

  std::unique_ptr<PinnedInputs> pinned_inputs;  // inputs in the message of GPU models' requests go there

  explicit Impl(FrontOptions o) : options(std::move(o)), regions(options.pin_gpu) {
    if (options.pin_gpu >= 0 && options.pinned_input_bytes > 0)
      pinned_inputs = std::make_unique<PinnedInputs>(options.pinned_input_bytes, PinnedInputs::for_gpu(options.pin_gpu));
  }

  // The inputs a request carries (those in a region are locked already) copied into page-locked
  // buffers here, on one of gRPC's threads, so that the batch's run copies them to the GPU directly
  // instead of staging one request after another on its own thread.
  void stage_in_pinned_memory(const pb::ModelInferRequest& request, Tensors& inputs) {
    for (const auto& in : request.inputs()) {
      if (in.parameters().count("shared_memory_region")) continue;
      auto it = inputs.find(in.name());
      if (it == inputs.end() || it->second.nbytes() == 0) continue;
      Tensor& tensor = it->second;
      std::shared_ptr<unsigned char[]> buffer = pinned_inputs->take(tensor.nbytes());
      if (!buffer) return;  // every buffer is in use: the rest stay where they lie
      std::memcpy(buffer.get(), tensor.raw(), tensor.nbytes());
      tensor = Tensor::over_storage(tensor.dtype(), tensor.shape(), std::move(buffer));
    }
  }

  // --- the model a request names -----------------------------------------------------------
  Model& find(const std::string& name, const std::string& version) {
    auto it = models.find(name);
    if (it == models.end()) refuse("no model '" + name + "' is served here", grpc::StatusCode::NOT_FOUND);
    const std::string& own = it->second->served.version;
    if (!version.empty() && !own.empty() && version != own)
      refuse("model '" + name + "' has no version '" + version + "' (it serves version " + own + ")",
             grpc::StatusCode::NOT_FOUND);
    return *it->second;
  }

  // Checks a request and queues it; `finish` gets the answer's status (on the thread that ran
  // its batch, or on this one when the request is refused).
  void infer(const std::shared_ptr<const pb::ModelInferRequest>& request, pb::ModelInferResponse* response,
             std::function<void(grpc::Status)> finish) {
    Model* model = nullptr;
    RequestInputs prepared;
    try {
      model = &find(request->model_name(), request->model_version());
      if (!model->batcher) refuse("the server is shutting down", grpc::StatusCode::UNAVAILABLE);
      model->requests.fetch_add(1, std::memory_order_relaxed);
      prepared = decode_request(*request, model->served, regions, options.max_request_bytes, request);
      if (pinned_inputs && model->on_gpu) stage_in_pinned_memory(*request, prepared.inputs);
    } catch (const Refusal& r) {
      if (model) model->errors.fetch_add(1, std::memory_order_relaxed);
      finish(grpc::Status(r.code, r.message));
      return;
    }
    const std::string refused =
        model->batcher->submit(std::move(prepared.inputs), prepared.rows,
                               [this, model, request, response, finish](const BatchResult& result) {
                                 try {
                                   write_answer(*request, model->served, regions, result, response);
                                 } catch (const Refusal& r) {
                                   model->errors.fetch_add(1, std::memory_order_relaxed);
                                   finish(grpc::Status(r.code, r.message));
                                   return;
                                 }
                                 finish(grpc::Status::OK);
                               });
    if (!refused.empty()) {
      model->errors.fetch_add(1, std::memory_order_relaxed);
      finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "model '" + model->served.name + "': " + refused));
    }
  }

  // --- the service's methods ---------------------------------------------------------------
  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context, const pb::ServerLiveRequest*,
                                       pb::ServerLiveResponse* response) override {
    response->set_live(true);
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context, const pb::ServerReadyRequest*,
                                        pb::ServerReadyResponse* response) override {
    response->set_ready(true);  // the front starts once every model is loaded and warmed
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context, const pb::ModelReadyRequest* request,
                                       pb::ModelReadyResponse* response) override {
    try {
      find(request->name(), request->version());
      response->set_ready(true);
    } catch (const Refusal& r) {
      return finished(context, grpc::Status(r.code, r.message));
    }
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context, const pb::ServerMetadataRequest*,
                                           pb::ServerMetadataResponse* response) override {
    response->set_name("kiln");
    response->set_version(options.server_version);
    response->add_extensions("system_shared_memory");
    response->add_extensions("binary_tensor_data");
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context, const pb::ModelMetadataRequest* request,
                                          pb::ModelMetadataResponse* response) override {
    try {
      const ServedModel& served = find(request->name(), request->version()).served;
      response->set_name(served.name);
      if (!served.version.empty()) response->add_versions(served.version);
      response->set_platform("kiln");
      auto describe = [](const TensorDesc& d, pb::ModelMetadataResponse::TensorMetadata* m) {
        m->set_name(d.name);
        m->set_datatype(datatype_name(d.dtype));
        for (int64_t s : d.shape) m->add_shape(s);
      };
      for (const TensorDesc& d : served.inputs) describe(d, response->add_inputs());
      for (const TensorDesc& d : served.outputs) describe(d, response->add_outputs());
    } catch (const Refusal& r) {
      return finished(context, grpc::Status(r.code, r.message));
    }
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context, const pb::ModelInferRequest* request,
                                       pb::ModelInferResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    // The request outlives the call's use of it: gRPC frees it only after Finish.
    std::shared_ptr<const pb::ModelInferRequest> borrowed_request(std::shared_ptr<void>(), request);
    infer(borrowed_request, response, [reactor](grpc::Status status) { reactor->Finish(std::move(status)); });
    return reactor;
  }

  grpc::ServerBidiReactor<pb::ModelInferRequest, pb::ModelStreamInferResponse>* ModelStreamInfer(
      grpc::CallbackServerContext*) override;

  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(grpc::CallbackServerContext* context,
                                                     const pb::SystemSharedMemoryStatusRequest* request,
                                                     pb::SystemSharedMemoryStatusResponse* response) override {
    try {
      for (const RegionStatus& r : regions.status(request->name())) {
        auto& entry = (*response->mutable_regions())[r.name];
        entry.set_name(r.name);
        entry.set_key(r.key);
        entry.set_offset(r.offset);
        entry.set_byte_size(r.byte_size);
      }
    } catch (const RegionNotFound& e) {
      return finished(context, grpc::Status(grpc::StatusCode::NOT_FOUND, e.what()));
    }
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(grpc::CallbackServerContext* context,
                                                       const pb::SystemSharedMemoryRegisterRequest* request,
                                                       pb::SystemSharedMemoryRegisterResponse*) override {
    try {
      regions.register_region(request->name(), request->key(), request->offset(), request->byte_size());
    } catch (const Error& e) {
      return finished(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, e.what()));
    }
    return finished(context, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(grpc::CallbackServerContext* context,
                                                         const pb::SystemSharedMemoryUnregisterRequest* request,
                                                         pb::SystemSharedMemoryUnregisterResponse*) override {
    regions.unregister(request->name());
    return finished(context, grpc::Status::OK);
  }

  static grpc::ServerUnaryReactor* finished(grpc::CallbackServerContext* context, grpc::Status status) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(std::move(status));
    return reactor;
  }
};

namespace {

// One ModelStreamInfer call: every request read is checked and queued at once, and the answers
// are written in the order the requests came, each as soon as it and those before it are done.
// A request's error is its answer (error_message); the stream goes on. The call finishes once
// the client has stopped sending and every answer is written. At most kWindow requests of a
// stream are read and not yet answered: a client that sends without taking its answers is read
// no further until it does, so that it cannot fill the server's memory.
class StreamInfer final : public grpc::ServerBidiReactor<pb::ModelInferRequest, pb::ModelStreamInferResponse> {
 public:
  // Requests read and not yet answered, at most: more than a client keeps in flight to hide its
  // round trip (bench/serve_bench.py's streams keep 32), few enough that their inputs stay small.
  static constexpr uint64_t kWindow = 128;

  explicit StreamInfer(GrpcFront::Impl* front) : front_(front) { StartRead(&incoming_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::unique_lock<std::mutex> lock(mutex_);
      reads_done_ = true;
      proceed(lock);
      return;
    }
    auto request = std::make_shared<pb::ModelInferRequest>(std::move(incoming_));
    incoming_.Clear();
    uint64_t sequence = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sequence = next_read_++;
      ++in_flight_;
    }
    auto answer = std::make_shared<pb::ModelStreamInferResponse>();
    front_->infer(request, answer->mutable_infer_response(), [this, sequence, answer](grpc::Status status) {
      if (!status.ok()) {
        answer->clear_infer_response();
        answer->set_error_message(status.error_message());
      }
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.emplace(sequence, std::move(*answer));
      --in_flight_;
      proceed(lock);
    });
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reading_ = next_read_ - next_write_ < kWindow;
      if (!reading_) return;  // proceed() reads on once answers have gone out
    }
    StartRead(&incoming_);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mutex_);
    writing_ = false;
    if (!ok) broken_ = true;  // the client is gone: the rest are run but not written
    proceed(lock);
  }

  void OnDone() override {
    std::unique_lock<std::mutex> lock(mutex_);
    done_ = true;
    proceed(lock);
  }

 private:
  // Writes the next answer in order, finishes the call, or deletes this reactor once gRPC is
  // done with it and no batch still holds it. Called with the lock held; lets go of it.
  void proceed(std::unique_lock<std::mutex>& lock) {
    if (done_) {
      const bool last = in_flight_ == 0;
      lock.unlock();
      if (last) delete this;
      return;
    }
    if (finished_) return;
    if (broken_) {
      ready_.clear();
      if (!reading_) reads_done_ = true;  // (a client gone is read no more)
    }
    bool read = false, write = false, finish = false;
    if (!reading_ && !reads_done_ && next_read_ - next_write_ < kWindow) read = reading_ = true;
    auto next = writing_ ? ready_.end() : ready_.find(next_write_);
    if (next != ready_.end()) {
      write = writing_ = true;
      current_ = std::move(next->second);
      ready_.erase(next);
      ++next_write_;
    } else if (!writing_ && reads_done_ && in_flight_ == 0 && ready_.empty()) {
      finish = finished_ = true;
    }
    lock.unlock();
    if (read) StartRead(&incoming_);
    if (write) StartWrite(&current_);
    if (finish)
      Finish(broken_ ? grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading") : grpc::Status::OK);
  }

  GrpcFront::Impl* front_;
  pb::ModelInferRequest incoming_;
  pb::ModelStreamInferResponse current_;
  std::mutex mutex_;
  std::map<uint64_t, pb::ModelStreamInferResponse> ready_;
  uint64_t next_read_ = 0;
  uint64_t next_write_ = 0;
  uint64_t in_flight_ = 0;
  bool reading_ = true;  // a read is outstanding
  bool reads_done_ = false;
  bool writing_ = false;
  bool finished_ = false;
  bool broken_ = false;
  bool done_ = false;
};

}  // namespace

grpc::ServerBidiReactor<pb::ModelInferRequest, pb::ModelStreamInferResponse>* GrpcFront::Impl::ModelStreamInfer(
    grpc::CallbackServerContext*) {
  return new StreamInfer(this);
}

GrpcFront::GrpcFront(std::vector<ServedModel> models, FrontOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {
  for (ServedModel& served : models) {
    if (served.runners.empty())
      throw Error(ErrorKind::kInvalidArgument, "model '" + served.name + "' has no engine run to serve it");
    if (impl_->models.count(served.name))
      throw Error(ErrorKind::kInvalidArgument, "two models are named '" + served.name + "'");
    auto model = std::make_unique<Model>();
    model->batcher = std::make_unique<Batcher>(served.runners, served.batching);
    for (const Runner& runner : served.runners) model->on_gpu = model->on_gpu || runner.device != "cpu";
    model->served = std::move(served);
    impl_->models.emplace(model->served.name, std::move(model));
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(impl_->options.address, grpc::InsecureServerCredentials(), &impl_->bound_port);
  builder.RegisterService(impl_.get());
  // A request's inputs may be as large as the server takes, plus the message's own fields.
  const uint64_t largest = impl_->options.max_request_bytes + (uint64_t{1} << 20);
  builder.SetMaxReceiveMessageSize(largest > INT32_MAX ? INT32_MAX : static_cast<int>(largest));
  builder.SetMaxSendMessageSize(-1);
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || impl_->bound_port == 0)
    throw Error(ErrorKind::kIo, "kiln serve: cannot listen for gRPC on " + impl_->options.address +
                                    " (is the port taken?)");
}

GrpcFront::~GrpcFront() { shutdown(); }

int GrpcFront::port() const { return impl_->bound_port; }

SharedMemoryRegions& GrpcFront::shared_memory() { return impl_->regions; }

void GrpcFront::shutdown(double grace_seconds) {
  std::lock_guard<std::mutex> lock(impl_->shutdown_mutex);
  if (impl_->shut_down) return;
  impl_->shut_down = true;
  // New calls are refused; calls in flight get until the deadline, their batches still running.
  impl_->server->Shutdown(std::chrono::system_clock::now() +
                          std::chrono::microseconds(static_cast<int64_t>(grace_seconds * 1e6)));
  // Every queued request runs (a cancelled call's answer goes nowhere), then the runs stop.
  for (auto& [_, model] : impl_->models) model->batcher.reset();
  impl_->server->Wait();
}

std::map<std::string, ModelStats> GrpcFront::stats() const {
  std::map<std::string, ModelStats> out;
  for (const auto& [name, model] : impl_->models) {
    ModelStats s;
    s.requests = model->requests.load(std::memory_order_relaxed);
    s.errors = model->errors.load(std::memory_order_relaxed);
    if (model->batcher) s.batching = model->batcher->stats();
    out[name] = s;
  }
  return out;
}

Tensors GrpcFront::run(const std::string& model_name, Tensors inputs, int64_t rows) {
  auto it = impl_->models.find(model_name);
  if (it == impl_->models.end() || !it->second->batcher)
    throw Error(ErrorKind::kInvalidArgument, "no model '" + model_name + "' is served here");
  Model& model = *it->second;
  model.requests.fetch_add(1, std::memory_order_relaxed);
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  Tensors out;
  std::string error;
  const std::string refused = model.batcher->submit(std::move(inputs), rows, [&](const BatchResult& result) {
    Tensors mine;
    if (result.error.empty()) {
      for (const auto& [name, all] : *result.outputs) mine[name] = rows_of(all, result.first_row, result.rows);
    }
    std::lock_guard<std::mutex> lock(mutex);
    out = std::move(mine);
    error = result.error;
    done = true;
    finished.notify_one();
  });
  if (!refused.empty()) {
    model.errors.fetch_add(1, std::memory_order_relaxed);
    throw Unavailable("model '" + model_name + "': " + refused);
  }
  std::unique_lock<std::mutex> lock(mutex);
  finished.wait(lock, [&] { return done; });
  if (!error.empty()) {
    model.errors.fetch_add(1, std::memory_order_relaxed);
    throw Error(ErrorKind::kInvalidArgument, "model '" + model_name + "': " + error);
  }
  return out;
}

void GrpcFront::count(const std::string& model_name, uint64_t requests, uint64_t errors) {
  auto it = impl_->models.find(model_name);
  if (it == impl_->models.end()) throw Error(ErrorKind::kInvalidArgument, "no model '" + model_name + "' is served here");
  it->second->requests.fetch_add(requests, std::memory_order_relaxed);
  it->second->errors.fetch_add(errors, std::memory_order_relaxed);
}

}  // namespace kiln::serve
