// A load generator for the Open Inference Protocol's gRPC service (KServe v2, as `kiln serve` and
// Triton answer it), in C++: Triton's perf_analyzer's concurrency mode, which is not installable
// here (PyPI's `perf-analyzer` is an empty placeholder). A fixed number of ModelInfer requests are
// in flight, each sent again as soon as it is answered, for a warm-up and then a measured time;
// the input travels in each request, or lies in a system shared-memory region registered once
// (perf_analyzer's --shared-memory system). With --stream, ModelStreamInfer streams carry the
// requests instead (cameras' frames): --streams of them, each on a connection of its own, each
// with --concurrency requests sent and not yet answered at most. A Python client spends more
// time per request than the server it measures: this one leaves the server as the thing measured.
//
//   infer_load --url 127.0.0.1:8001 --model NAME --input NAME --shape 64,3,224,224
//              [--concurrency 4] [--connections K] [--seconds 4] [--warmup 1]
//              [--shared-memory none|system] [--stream [--streams 1]] [--seed 0]
//
// The input is FP32, standard-normal values. Prints one JSON object (bench/serve_bench.py reads
// it): requests answered among those sent after the warm-up, errors, the rows answered per second,
// latency percentiles (ms, send to answer) and the five slowest requests with when they were sent.
// A request whose answer has no output, or that fails, is an error; the first error's message
// goes to standard error. Exits 2 on bad arguments, 1 when the server cannot be used.
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "inference.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;
using Stub = inference::GRPCInferenceService::Stub;

struct Options {
  std::string url, model, input, shared_memory = "none";
  std::vector<int64_t> shape;
  int concurrency = 1, connections = 0, seed = 0, streams = 1;
  bool stream = false;
  double seconds = 4, warmup = 1;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "infer_load: %s\nusage: infer_load --url HOST:PORT --model NAME --input NAME --shape D0,D1,... "
               "[--concurrency N] [--connections K] [--seconds S] [--warmup S] [--shared-memory none|system] "
               "[--stream [--streams N]] [--seed N]\n",
               why.c_str());
  std::exit(2);
}

double number(const std::string& flag, const std::string& text, double low, double high) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v) || v < low || v > high) {
    char range[64];
    std::snprintf(range, sizeof range, "%g to %g", low, high);
    usage(flag + " is '" + text + "': not a number from " + range);
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--stream") {
      o.stream = true;
      continue;
    }
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--url") {
      o.url = value;
    } else if (flag == "--model") {
      o.model = value;
    } else if (flag == "--input") {
      o.input = value;
    } else if (flag == "--shape") {
      size_t at = 0;
      while (at <= value.size()) {
        const size_t comma = std::min(value.find(',', at), value.size());
        o.shape.push_back(static_cast<int64_t>(number("--shape", value.substr(at, comma - at), 1, 1 << 30)));
        at = comma + 1;
      }
    } else if (flag == "--concurrency") {
      o.concurrency = static_cast<int>(number(flag, value, 1, 65536));
    } else if (flag == "--connections") {
      o.connections = static_cast<int>(number(flag, value, 1, 1024));
    } else if (flag == "--seconds") {
      o.seconds = number(flag, value, 0.1, 3600);
    } else if (flag == "--warmup") {
      o.warmup = number(flag, value, 0, 3600);
    } else if (flag == "--shared-memory") {
      if (value != "none" && value != "system") usage("--shared-memory is '" + value + "': none or system");
      o.shared_memory = value;
    } else if (flag == "--streams") {
      o.streams = static_cast<int>(number(flag, value, 1, 1024));
    } else if (flag == "--seed") {
      o.seed = static_cast<int>(number(flag, value, 0, 1 << 30));
    } else {
      usage("unknown option " + flag);
    }
  }
  if (o.url.empty() || o.model.empty() || o.input.empty() || o.shape.empty())
    usage("--url, --model, --input and --shape are required");
  // Each connection is an HTTP/2 connection of its own, and gRPC's threads serve each apart: a
  // few of them keep one connection's ordering from being the bottleneck.
  if (o.connections == 0) o.connections = o.stream ? o.streams : std::min(o.concurrency, 8);
  if (o.streams > 1 && !o.stream) usage("--streams goes with --stream");
  return o;
}

// A POSIX shared-memory object holding the input, unlinked when done.
class SharedInput {
 public:
  SharedInput(const std::string& key, const std::vector<float>& values) : key_(key), bytes_(values.size() * 4) {
    const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw std::runtime_error("shm_open(" + key + "): " + std::strerror(errno));
    void* at = MAP_FAILED;
    if (ftruncate(fd, static_cast<off_t>(bytes_)) == 0)
      at = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int saved = errno;
    close(fd);
    if (at == MAP_FAILED) {
      shm_unlink(key.c_str());
      throw std::runtime_error("shared memory " + key + " of " + std::to_string(bytes_) + " bytes: " + std::strerror(saved));
    }
    std::memcpy(at, values.data(), bytes_);
    munmap(at, bytes_);  // the server maps it itself; the object lives until unlinked
  }
  ~SharedInput() { shm_unlink(key_.c_str()); }
  SharedInput(const SharedInput&) = delete;
  SharedInput& operator=(const SharedInput&) = delete;
  size_t bytes() const { return bytes_; }

 private:
  std::string key_;
  size_t bytes_;
};

struct Sample {
  double latency_s;
  double sent_at_s;  // after the warm-up
};

class Load;

// One request in flight: sent, answered, sent again until the measured time is over.
class Slot {
 public:
  Slot(Load& load, Stub& stub) : load_(load), stub_(stub) {}
  void send();
  std::vector<Sample> samples;
  uint64_t errors = 0;

 private:
  void answered(const grpc::Status& status);
  Load& load_;
  Stub& stub_;
  // The call's context, and the one before it, which the callback that sends the next call
  // belongs to: gRPC may still touch it until that callback returns.
  std::unique_ptr<grpc::ClientContext> context_, previous_;
  inference::ModelInferResponse response_;
  Clock::time_point sent_;
};

class Load {
 public:
  Load(const Options& o, inference::ModelInferRequest request, std::vector<std::unique_ptr<Stub>>& stubs)
      : request_(std::move(request)), start_(Clock::now()) {
    measured_from_ = start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.warmup));
    end_ = measured_from_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
    for (int i = 0; i < o.concurrency; ++i) slots_.push_back(std::make_unique<Slot>(*this, *stubs[i % stubs.size()]));
  }

  // Runs every slot until the measured time is over and every request is answered.
  void run() {
    running_ = static_cast<int>(slots_.size());
    for (auto& slot : slots_) slot->send();
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [this] { return running_ == 0; });
  }

  const inference::ModelInferRequest& request() const { return request_; }
  Clock::time_point measured_from() const { return measured_from_; }
  Clock::time_point end() const { return end_; }
  const std::vector<std::unique_ptr<Slot>>& slots() const { return slots_; }

  void slot_finished() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--running_ == 0) finished_.notify_all();
  }
  void error(const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (first_error_.empty()) first_error_ = message;
  }
  std::string first_error() const { return first_error_; }

 private:
  inference::ModelInferRequest request_;  // the same for every call: gRPC only reads it
  Clock::time_point start_, measured_from_, end_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::mutex mutex_;
  std::condition_variable finished_;
  int running_ = 0;
  std::string first_error_;
};

void Slot::send() {
  previous_ = std::move(context_);
  context_ = std::make_unique<grpc::ClientContext>();
  // A server that stops answering ends the run as errors, never as a hang.
  context_->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  response_.Clear();
  sent_ = Clock::now();
  stub_.async()->ModelInfer(context_.get(), &load_.request(), &response_,
                            [this](grpc::Status status) { answered(status); });
}

void Slot::answered(const grpc::Status& status) {
  const Clock::time_point now = Clock::now();
  if (!status.ok() || response_.outputs_size() == 0) {
    errors += 1;
    load_.error(status.ok() ? "an answer without outputs" : status.error_message());
  } else if (sent_ >= load_.measured_from()) {
    samples.push_back({std::chrono::duration<double>(now - sent_).count(),
                       std::chrono::duration<double>(sent_ - load_.measured_from()).count()});
  }
  if (now < load_.end())
    send();  // (a callback may start the next call; it runs on one of gRPC's threads)
  else
    load_.slot_finished();
}

// One ModelStreamInfer stream: requests written one after another (gRPC takes one write at a
// time), at most `window` unanswered; each answer names its request by id. Once the measured time
// is over, the client half-closes and the server's remaining answers end the stream.
class Stream final : public grpc::ClientBidiReactor<inference::ModelInferRequest, inference::ModelStreamInferResponse> {
 public:
  Stream(Stub& stub, inference::ModelInferRequest request, int window, Clock::time_point measured_from,
         Clock::time_point end)
      : request_(std::move(request)), window_(window), measured_from_(measured_from), end_(end) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60) +
                          std::chrono::duration_cast<std::chrono::seconds>(end - Clock::now()));
    stub.async()->ModelStreamInfer(&context_, this);
  }

  void start() {
    StartRead(&response_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      write_next();
    }
    StartCall();
  }
  // Waits for the stream's end; returns how it ended.
  grpc::Status wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    ended_.wait(lock, [this] { return done_; });
    return status_;
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mutex_);
    writing_ = false;
    if (!ok) return;  // the stream is over: OnDone follows
    write_next();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the server ended the stream: OnDone follows
    const Clock::time_point now = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto sent = sent_.find(response_.infer_response().id());
      if (!response_.error_message().empty() || sent == sent_.end() || response_.infer_response().outputs_size() == 0) {
        errors += 1;
        if (first_error.empty())
          first_error = !response_.error_message().empty() ? response_.error_message()
                        : sent == sent_.end()                 ? "an answer naming no request sent ('" +
                                                                    response_.infer_response().id() + "')"
                                                              : "an answer without outputs";
      } else if (sent->second >= measured_from_) {
        samples.push_back({std::chrono::duration<double>(now - sent->second).count(),
                           std::chrono::duration<double>(sent->second - measured_from_).count()});
      }
      if (sent != sent_.end()) sent_.erase(sent);
      unanswered_ -= 1;
      write_next();
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mutex_);
    status_ = status;
    done_ = true;
    ended_.notify_all();
  }

  std::vector<Sample> samples;
  uint64_t errors = 0;
  std::string first_error;

 private:
  // With the lock held: the next request if the window has room and time is left; the half-close
  // once time is over (answers still come).
  void write_next() {
    if (writing_ || closed_) return;
    if (Clock::now() >= end_) {
      closed_ = true;
      StartWritesDone();
      return;
    }
    if (unanswered_ >= window_) return;
    const std::string id = std::to_string(next_id_++);
    request_.set_id(id);  // gRPC is done with the previous write's message (OnWriteDone came)
    sent_[id] = Clock::now();
    unanswered_ += 1;
    writing_ = true;
    StartWrite(&request_);
  }

  grpc::ClientContext context_;
  inference::ModelInferRequest request_;
  inference::ModelStreamInferResponse response_;
  const int window_;
  const Clock::time_point measured_from_, end_;
  std::mutex mutex_;
  std::condition_variable ended_;
  std::map<std::string, Clock::time_point> sent_;
  uint64_t next_id_ = 0;
  int unanswered_ = 0;
  bool writing_ = false, closed_ = false, done_ = false;
  grpc::Status status_;
};

double percentile(std::vector<double> sorted, double p) {
  if (sorted.empty()) return std::nan("");
  const double at = p / 100 * static_cast<double>(sorted.size() - 1);
  const size_t low = static_cast<size_t>(std::floor(at));
  const size_t high = std::min(low + 1, sorted.size() - 1);
  return sorted[low] + (sorted[high] - sorted[low]) * (at - static_cast<double>(low));
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "NaN";  // as Python's json writes it
  char text[64];
  std::snprintf(text, sizeof text, "%.6f", v);
  return text;
}

int run(const Options& o) {
  int64_t count = 1;
  for (int64_t d : o.shape) {
    if (count > (int64_t{1} << 40) / d) usage("--shape holds more than 2^40 values");
    count *= d;
  }
  std::vector<float> values(static_cast<size_t>(count));
  std::mt19937 random(static_cast<unsigned>(o.seed));
  std::normal_distribution<float> normal;
  for (float& v : values) v = normal(random);

  std::vector<std::unique_ptr<Stub>> stubs;
  for (int i = 0; i < o.connections; ++i) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(-1);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    args.SetInt("kiln.infer_load.connection", i);
    stubs.push_back(inference::GRPCInferenceService::NewStub(
        grpc::CreateCustomChannel(o.url, grpc::InsecureChannelCredentials(), args)));
  }
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    inference::ModelReadyRequest ask;
    ask.set_name(o.model);
    inference::ModelReadyResponse ready;
    const grpc::Status status = stubs[0]->ModelReady(&context, ask, &ready);
    if (!status.ok() || !ready.ready()) {
      std::fprintf(stderr, "infer_load: model '%s' at %s is not ready: %s\n", o.model.c_str(), o.url.c_str(),
                   status.ok() ? "the server says so" : status.error_message().c_str());
      return 1;
    }
  }

  inference::ModelInferRequest request;
  request.set_model_name(o.model);
  auto* input = request.add_inputs();
  input->set_name(o.input);
  input->set_datatype("FP32");
  for (int64_t d : o.shape) input->add_shape(d);
  std::unique_ptr<SharedInput> shared;
  const std::string region = "infer_load_" + std::to_string(getpid());
  if (o.shared_memory == "system") {
    shared = std::make_unique<SharedInput>("/" + region, values);
    grpc::ClientContext context;
    inference::SystemSharedMemoryRegisterRequest registration;
    registration.set_name(region);
    registration.set_key("/" + region);
    registration.set_offset(0);
    registration.set_byte_size(shared->bytes());
    inference::SystemSharedMemoryRegisterResponse registered;
    const grpc::Status status = stubs[0]->SystemSharedMemoryRegister(&context, registration, &registered);
    if (!status.ok()) {
      std::fprintf(stderr, "infer_load: registering shared memory %s: %s\n", region.c_str(),
                   status.error_message().c_str());
      return 1;
    }
    (*input->mutable_parameters())["shared_memory_region"].set_string_param(region);
    (*input->mutable_parameters())["shared_memory_byte_size"].set_int64_param(static_cast<int64_t>(shared->bytes()));
  } else {
    request.add_raw_input_contents(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }

  std::vector<Sample> all;
  uint64_t errors = 0;
  std::string first_error;
  if (o.stream) {
    const Clock::time_point measured_from =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.warmup));
    const Clock::time_point end =
        measured_from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
    std::vector<std::unique_ptr<Stream>> streams;
    for (int i = 0; i < o.streams; ++i)
      streams.push_back(std::make_unique<Stream>(*stubs[static_cast<size_t>(i) % stubs.size()], request, o.concurrency,
                                                 measured_from, end));
    for (auto& stream : streams) stream->start();
    for (auto& stream : streams) {
      const grpc::Status status = stream->wait();
      all.insert(all.end(), stream->samples.begin(), stream->samples.end());
      errors += stream->errors + (status.ok() ? 0 : 1);
      if (first_error.empty())
        first_error = !status.ok() ? "a stream ended with " + status.error_message() : stream->first_error;
    }
  } else {
    Load load(o, std::move(request), stubs);
    load.run();
    for (const auto& slot : load.slots()) {
      errors += slot->errors;
      all.insert(all.end(), slot->samples.begin(), slot->samples.end());
    }
    first_error = load.first_error();
  }

  if (shared) {
    grpc::ClientContext context;
    inference::SystemSharedMemoryUnregisterRequest unregistration;
    unregistration.set_name(region);
    inference::SystemSharedMemoryUnregisterResponse unregistered;
    (void)stubs[0]->SystemSharedMemoryUnregister(&context, unregistration, &unregistered);
  }

  std::vector<double> latencies;
  for (const Sample& s : all) latencies.push_back(s.latency_s * 1000);
  std::sort(latencies.begin(), latencies.end());
  std::sort(all.begin(), all.end(), [](const Sample& a, const Sample& b) { return a.latency_s > b.latency_s; });
  double mean = 0;
  for (double l : latencies) mean += l;
  mean = latencies.empty() ? std::nan("") : mean / static_cast<double>(latencies.size());
  if (!first_error.empty()) std::fprintf(stderr, "infer_load: first error: %s\n", first_error.c_str());

  std::string slowest;
  for (size_t i = 0; i < std::min<size_t>(all.size(), 5); ++i)
    slowest += std::string(i ? ", " : "") + "{\"latency_ms\": " + json_number(all[i].latency_s * 1000) +
               ", \"sent_at_s\": " + json_number(all[i].sent_at_s) + "}";
  std::printf(
      "{\"requests\": %zu, \"errors\": %llu, \"seconds\": %s, \"throughput_per_s\": %s, \"latency_ms\": "
      "{\"p50\": %s, \"p90\": %s, \"p99\": %s, \"mean\": %s}, \"slowest\": [%s], \"connections\": %d}\n",
      latencies.size(), static_cast<unsigned long long>(errors), json_number(o.seconds).c_str(),
      json_number(static_cast<double>(latencies.size()) * static_cast<double>(o.shape[0]) / o.seconds).c_str(),
      json_number(percentile(latencies, 50)).c_str(), json_number(percentile(latencies, 90)).c_str(),
      json_number(percentile(latencies, 99)).c_str(), json_number(mean).c_str(), slowest.c_str(), o.connections);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "infer_load: %s\n", e.what());
    return 1;
  }
}
