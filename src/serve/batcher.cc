#include "serve/batcher.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <utility>

#include "kiln/error.h"

namespace kiln::serve {

int64_t padded_rows(int64_t rows, const std::vector<int64_t>& batch_sizes) {
  int64_t best = -1;
  for (int64_t size : batch_sizes)
    if (size >= rows && (best < 0 || size < best)) best = size;
  return best < 0 ? rows : best;
}

std::vector<int64_t> planned_batch_sizes(int64_t max_batch) {
  constexpr size_t kShapesAContextKeeps = 16;  // CudaContext::kMaxGraphs
  max_batch = std::max<int64_t>(max_batch, 1);
  std::vector<int64_t> sizes;
  int64_t top = 0;  // the largest power of two below max_batch
  for (int64_t b = 1; b < max_batch; b *= 2) sizes.push_back(top = b);
  if (top > 0) {
    const int64_t step = ((max_batch - top + 3) / 4 + 7) / 8 * 8;
    for (int64_t b = top + step; b < max_batch; b += step) sizes.push_back(b);
  }
  sizes.push_back(max_batch);
  if (sizes.size() > kShapesAContextKeeps) sizes.erase(sizes.begin(), sizes.end() - kShapesAContextKeeps);
  return sizes;
}

Tensors joined(const std::map<std::string, std::vector<Tensor>>& pieces, int64_t zero_rows) {
  Tensors out;
  for (const auto& [name, list] : pieces) {
    const Tensor& first = list.front();
    if (first.rank() == 0) {  // a scalar input: the batch is one request
      out[name] = first.clone();
      continue;
    }
    std::vector<int64_t> shape = first.shape();
    shape[0] = zero_rows;
    for (const Tensor& t : list) shape[0] += t.dim(0);
    Tensor whole = Tensor::uninitialized(first.dtype(), shape);
    auto* at = static_cast<unsigned char*>(whole.raw());
    for (const Tensor& t : list) {
      if (t.nbytes()) std::memcpy(at, t.raw(), t.nbytes());
      at += t.nbytes();
    }
    const auto* end = static_cast<unsigned char*>(whole.raw()) + whole.nbytes();
    if (end > at) std::memset(at, 0, static_cast<size_t>(end - at));
    out[name] = std::move(whole);
  }
  return out;
}

namespace {

// Requests batch together when their inputs agree in everything but the first dimension.
bool same_shapes_past_rows(const Tensors& a, const Tensors& b) {
  if (a.size() != b.size()) return false;
  for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib) {
    const Tensor& x = ia->second;
    const Tensor& y = ib->second;
    if (ia->first != ib->first || x.dtype() != y.dtype() || x.rank() != y.rank()) return false;
    for (int d = 1; d < x.rank(); ++d)
      if (x.dim(d) != y.dim(d)) return false;
  }
  return true;
}

}  // namespace

Batcher::Batcher(std::vector<Runner> runners, BatchingOptions options)
    : runners_(std::move(runners)), options_(std::move(options)) {
  if (runners_.empty()) throw Error(ErrorKind::kInvalidArgument, "a batcher needs at least one engine run");
  options_.max_batch = std::max<int64_t>(options_.max_batch, 1);
  for (const Runner& runner : runners_) stats_.runs_by_device[runner.device] = 0;  // each device's series from the start
  answerers_.reserve(runners_.size());
  for (size_t i = 0; i < runners_.size(); ++i) {
    answerers_.push_back(std::make_unique<Answerer>());
    Answerer& answerer = *answerers_.back();
    answerer.thread = std::thread([&answerer] { answer_loop(answerer); });
  }
  threads_.reserve(runners_.size());
  for (size_t i = 0; i < runners_.size(); ++i) threads_.emplace_back([this, i] { run_loop(i); });
}

Batcher::~Batcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  for (std::thread& t : threads_) t.join();
  // Every batch has run: its answers go out, then the answering threads end.
  for (auto& answerer : answerers_) {
    {
      std::lock_guard<std::mutex> lock(answerer->mutex);
      answerer->stopping = true;
    }
    answerer->ready.notify_one();
    answerer->thread.join();
  }
}

std::string Batcher::submit(Tensors inputs, int64_t rows, Done done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string refused;
    if (stopping_)
      refused = "the server is shutting down";
    else if (options_.max_queue > 0 && static_cast<int64_t>(queue_.size()) >= options_.max_queue)
      refused = std::to_string(queue_.size()) + " requests are waiting already (kiln serve --max-queue " +
                std::to_string(options_.max_queue) + "): try again later";
    if (!refused.empty()) {
      stats_.refused += 1;
      return refused;
    }
    queue_.push_back(Pending{std::move(inputs), rows, std::move(done), std::chrono::steady_clock::now()});
  }
  queued_.notify_all();
  return "";
}

void Histogram::add(double value) {
  for (size_t i = 0; i < bounds.size(); ++i) at_most[i] += value <= bounds[i] ? 1 : 0;
  count += 1;
  sum += value;
}

BatcherStats Batcher::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::vector<Batcher::Pending> Batcher::take_batch(std::unique_lock<std::mutex>& lock) {
  // The caller holds the lock and the queue is not empty. While this run gathers (and waits for
  // more requests), the other runs wait: one batch forms at a time, in arrival order.
  std::vector<Pending> batch;
  batch.push_back(std::move(queue_.front()));
  queue_.pop_front();
  int64_t rows = batch.front().rows;
  const auto deadline = batch.front().queued + options_.max_queue_delay;
  while (rows < options_.max_batch) {
    if (queue_.empty()) {
      if (stopping_ || std::chrono::steady_clock::now() >= deadline) break;
      queued_.wait_until(lock, deadline, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) break;
    }
    Pending& next = queue_.front();
    // The first request that does not fit ends the batch (and starts the next one).
    if (rows + next.rows > options_.max_batch || !same_shapes_past_rows(next.inputs, batch.front().inputs)) break;
    rows += next.rows;
    batch.push_back(std::move(next));
    queue_.pop_front();
  }
  return batch;
}

void Batcher::run_loop(size_t runner) {
  for (;;) {
    std::vector<Pending> batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [this] { return (stopping_ || !queue_.empty()) && !gathering_; });
      if (queue_.empty()) return;  // stopping, and nothing is left to run
      gathering_ = true;
      batch = take_batch(lock);
      gathering_ = false;
    }
    queued_.notify_all();  // another run may gather the next batch now
    run_batch(runner, batch);
  }
}

void Batcher::run_batch(size_t runner_index, std::vector<Pending>& batch) {
  Runner& runner = runners_[runner_index];
  const auto start = std::chrono::steady_clock::now();
  int64_t rows = 0;
  for (const Pending& p : batch) rows += p.rows;
  const int64_t padded = padded_rows(rows, options_.batch_sizes);
  std::map<std::string, std::vector<Tensor>> pieces;
  for (const Pending& p : batch)
    for (const auto& [name, tensor] : p.inputs) pieces[name].push_back(tensor);
  Finished finished;
  try {
    finished.outputs = runner.run(pieces, padded - rows);
  } catch (const std::exception& e) {
    finished.error = e.what();
  }
  const auto ran = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.runs += 1;
    stats_.rows += static_cast<uint64_t>(rows);
    stats_.batch_rows.add(static_cast<double>(rows));
    stats_.requests += batch.size();
    stats_.failed_runs += finished.error.empty() ? 0 : 1;
    stats_.compute_seconds.add(std::chrono::duration<double>(ran - start).count());
    for (const Pending& p : batch) stats_.queue_seconds.add(std::chrono::duration<double>(start - p.queued).count());
    stats_.runs_by_device[runner.device] += 1;
  }
  finished.batch = std::move(batch);
  // One request is answered here: handing it over would only add a thread's wake-up to its latency.
  if (finished.batch.size() == 1) {
    answer(finished);
    return;
  }
  for (Pending& p : finished.batch) p.inputs.clear();  // (page-locked buffers go back to their pool now)
  Answerer& answerer = *answerers_[runner_index];
  {
    std::lock_guard<std::mutex> lock(answerer.mutex);
    answerer.finished.push_back(std::move(finished));
  }
  answerer.ready.notify_one();
}

void Batcher::answer(Finished& finished) {
  BatchResult result;
  result.error = finished.error;
  if (result.error.empty()) result.outputs = &finished.outputs;
  for (Pending& p : finished.batch) {
    result.rows = p.rows;
    try {
      p.done(result);
    } catch (...) {
      // A callback answers its own request; one that fails must not cost the others theirs.
    }
    result.first_row += p.rows;
  }
}

void Batcher::answer_loop(Answerer& answerer) {
  for (;;) {
    Finished finished;
    {
      std::unique_lock<std::mutex> lock(answerer.mutex);
      answerer.ready.wait(lock, [&] { return answerer.stopping || !answerer.finished.empty(); });
      if (answerer.finished.empty()) return;  // stopping, and every batch is answered
      finished = std::move(answerer.finished.front());
      answerer.finished.pop_front();
    }
    answer(finished);
  }
}

}  // namespace kiln::serve
