// Dynamic batching for a served model: requests queue, and each free engine run takes the
// oldest request with every queued one that fits beside it (the same shapes past the first
// dimension, at most max_batch rows), waiting for more only until the oldest has waited
// max_queue_delay. The batch is padded to the smallest planned batch size that holds it (a GPU
// context keeps a plan and a CUDA graph per shape), run, and every request gets its rows of the
// outputs. The same policy as kiln serve's Python batcher (python/kiln/serve.py, Batcher).
//
// Each run has a thread that runs its batches and one that answers them: a batch's requests are
// answered (their callbacks write each one's outputs into its message and hand it to gRPC, tens of
// microseconds each) while the run takes its next batch, rather than a run waiting a millisecond
// or more between batches of a hundred one-image requests. A batch of one request is answered on
// the run's own thread, which has nothing to wait for then, and the answer no wake-up.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::serve {

using Tensors = std::map<std::string, Tensor>;

// One engine run a batch can go to: a GPU context, or the CPU engine. `run` takes each input as
// its pieces (one per request, to be joined along the first dimension) and a number of zero rows
// to pad with, and returns the outputs of the whole padded batch.
struct Runner {
  std::string device;  // "cpu", or the GPU's number
  std::function<Tensors(const std::map<std::string, std::vector<Tensor>>& pieces, int64_t zero_rows)> run;
};

struct BatchingOptions {
  int64_t max_batch = 1;  // rows a run takes; 1: requests run one by one
  std::chrono::microseconds max_queue_delay{0};
  std::vector<int64_t> batch_sizes;  // the sizes a batch is padded up to (none: no padding)
  int64_t max_queue = 0;             // requests waiting for a run at most (0: no bound); more are refused
};

// What a batch's run gives one request: the batch's outputs and where the request's rows lie in
// them, or the error every request of the batch gets. Valid only during the callback.
struct BatchResult {
  const Tensors* outputs = nullptr;
  int64_t first_row = 0;
  int64_t rows = 0;
  std::string error;  // empty: the run succeeded
};

// A Prometheus histogram's counts: how many observations were at most each bound (cumulative),
// how many there were and their sum.
struct Histogram {
  std::vector<double> bounds;     // ascending
  std::vector<uint64_t> at_most;  // at_most[i]: observations <= bounds[i]
  uint64_t count = 0;
  double sum = 0;

  explicit Histogram(std::vector<double> upper_bounds)
      : bounds(std::move(upper_bounds)), at_most(bounds.size(), 0) {}
  void add(double value);
};

// Counters of one model's batching, for metrics (the names and buckets of kiln serve's Python
// batcher's, so that /metrics reads alike whichever front serves); read while the batcher runs.
struct BatcherStats {
  uint64_t runs = 0;
  uint64_t rows = 0;
  uint64_t requests = 0;
  uint64_t failed_runs = 0;
  uint64_t refused = 0;  // requests not taken (max_queue requests waiting, or shutting down)
  Histogram batch_rows{{1, 2, 4, 8, 16, 32, 64, 128, 256}};  // rows per run, before padding
  Histogram queue_seconds{kSecondsBounds};                    // per request: queued until its run starts
  Histogram compute_seconds{kSecondsBounds};                  // per run
  std::map<std::string, uint64_t> runs_by_device;             // Runner::device -> runs
  // prometheus_client's default buckets, which the Python batcher's histograms use.
  static inline const std::vector<double> kSecondsBounds = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25,
                                                            0.5,   0.75, 1.0,   2.5,  5.0,   7.5, 10.0};
};

class Batcher {
 public:
  using Done = std::function<void(const BatchResult&)>;

  Batcher(std::vector<Runner> runners, BatchingOptions options);
  // Runs every request already queued, then stops its threads.
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues a request of `rows` rows (its inputs' first dimension). `done` runs once, when the
  // request's batch has run or failed: on the answering thread of the run that took it, or on the
  // run's thread when the batch is this one request. A request the batcher does not take
  // (max_queue requests already wait, or it is shutting down) is not queued and `done` is not
  // called: the returned reason says why ("" when it is queued).
  [[nodiscard]] std::string submit(Tensors inputs, int64_t rows, Done done);
  BatcherStats stats() const;

 private:
  struct Pending {
    Tensors inputs;
    int64_t rows;
    Done done;
    std::chrono::steady_clock::time_point queued;
  };
  // A batch that has run (or failed), waiting for its requests to be answered.
  struct Finished {
    std::vector<Pending> batch;
    Tensors outputs;
    std::string error;
  };
  // One run's answering thread and the batches it has yet to answer, in the order they ran.
  struct Answerer {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<Finished> finished;
    bool stopping = false;  // set once the run's thread has ended: answer what is left, then end
    std::thread thread;
  };
  void run_loop(size_t runner);
  std::vector<Pending> take_batch(std::unique_lock<std::mutex>& lock);
  void run_batch(size_t runner, std::vector<Pending>& batch);
  static void answer(Finished& finished);  // each request's callback, in the batch's order
  static void answer_loop(Answerer& answerer);

  std::vector<Runner> runners_;
  std::vector<std::unique_ptr<Answerer>> answerers_;  // one per run
  BatchingOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  bool gathering_ = false;  // a run is gathering a batch (one at a time)
  BatcherStats stats_;
  std::vector<std::thread> threads_;
};

// Each input's pieces joined along the first dimension, then `zero_rows` rows of zeros, in
// tensors of their own: what an engine run that takes whole inputs (the CPU engine's) is given.
Tensors joined(const std::map<std::string, std::vector<Tensor>>& pieces, int64_t zero_rows);
// The smallest of `batch_sizes` that holds `rows` (rows itself when none does).
int64_t padded_rows(int64_t rows, const std::vector<int64_t>& batch_sizes);
// The batch sizes a GPU model is planned at and its batches padded to: powers of two below
// max_batch; between the largest of them (P) and max_batch, steps of a quarter of the distance,
// rounded up to a multiple of 8; and max_batch. A batch of the top octave, where a loaded server's
// batches are, so pads by at most a quarter of P rather than up to all of it (76 rows ran as
// 128). The largest sixteen (a GPU context keeps sixteen shapes' plans and graphs).
std::vector<int64_t> planned_batch_sizes(int64_t max_batch);

}  // namespace kiln::serve
