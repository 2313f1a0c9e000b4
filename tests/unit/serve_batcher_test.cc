// The native gRPC front's dynamic batcher (src/serve/batcher.h): requests queued while the runs
// are busy leave together, each gets its own rows, batches never pass max_batch nor mix shapes,
// padding rows go to the run, an engine error reaches every request of its batch, and a batcher
// being destroyed runs what is queued first.
#include "serve/batcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace kiln::serve {
namespace {

// x [rows, width] float32 with each row's values equal to `value`.
Tensors rows_of_value(int64_t rows, int64_t width, float value) {
  Tensor x(DType::kFloat32, {rows, width});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = value;
  return {{"x", x}};
}

// A run that doubles its input (y = 2x) over the joined pieces, records each batch's rows and
// padding, and can be held until released.
struct RecordingRun {
  std::mutex mutex;
  std::condition_variable released_cv;
  bool held = false;
  bool released = false;
  std::vector<int64_t> batch_rows;  // rows of each run, padding included
  std::vector<int64_t> padding;
  std::atomic<int> started{0};

  Runner runner(std::string device = "cpu") {
    return Runner{std::move(device), [this](const std::map<std::string, std::vector<Tensor>>& pieces, int64_t zero_rows) {
                    started++;
                    {
                      std::unique_lock<std::mutex> lock(mutex);
                      released_cv.wait(lock, [this] { return !held || released; });
                    }
                    Tensors in = joined(pieces, zero_rows);
                    Tensor y = in.at("x").clone();
                    for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] *= 2;
                    std::lock_guard<std::mutex> lock(mutex);
                    batch_rows.push_back(y.dim(0));
                    padding.push_back(zero_rows);
                    return Tensors{{"y", y}};
                  }};
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    released = true;
    released_cv.notify_all();
  }
};

// Submits a request and returns a future of (its rows of y, first row's value) or the error.
struct Answer {
  int64_t rows = 0;
  std::vector<float> values;  // the first column of each of its rows
  std::string error;
};
// A request the batcher does not take is answered at once with the reason as its error.
std::future<Answer> submit(Batcher& batcher, int64_t rows, float value, int64_t width = 3) {
  auto promise = std::make_shared<std::promise<Answer>>();
  const std::string refused = batcher.submit(rows_of_value(rows, width, value), rows, [promise](const BatchResult& r) {
    Answer a;
    a.error = r.error;
    if (r.error.empty()) {
      const Tensor& y = r.outputs->at("y");
      a.rows = r.rows;
      for (int64_t i = 0; i < r.rows; ++i) a.values.push_back(y.data<float>()[(r.first_row + i) * y.dim(1)]);
    }
    promise->set_value(a);
  });
  if (!refused.empty()) promise->set_value(Answer{0, {}, refused});
  return promise->get_future();
}

TEST(ServeBatcher, RequestsQueuedWhileTheRunIsBusyLeaveAsOneBatchAndEachGetsItsRows) {
  RecordingRun run;
  run.held = true;
  Batcher batcher({run.runner()}, BatchingOptions{16, std::chrono::microseconds(0), {}});
  auto first = submit(batcher, 1, 1.0f);
  while (run.started.load() == 0) std::this_thread::yield();  // the first request runs alone, held
  std::vector<std::future<Answer>> queued;
  for (int i = 0; i < 5; ++i) queued.push_back(submit(batcher, 1 + i % 2, 10.0f + static_cast<float>(i)));
  run.release();
  EXPECT_EQ(first.get().values, std::vector<float>{2.0f});
  for (int i = 0; i < 5; ++i) {
    Answer a = queued[static_cast<size_t>(i)].get();
    ASSERT_TRUE(a.error.empty()) << a.error;
    EXPECT_EQ(a.rows, 1 + i % 2);
    for (float v : a.values) EXPECT_EQ(v, 2 * (10.0f + static_cast<float>(i)));
  }
  std::lock_guard<std::mutex> lock(run.mutex);
  EXPECT_EQ(run.batch_rows, (std::vector<int64_t>{1, 1 + 2 + 1 + 2 + 1}));
}

TEST(ServeBatcher, BatchesNeverPassMaxBatchNorMixShapes) {
  RecordingRun run;
  run.held = true;
  Batcher batcher({run.runner()}, BatchingOptions{4, std::chrono::microseconds(0), {}});
  auto blocker = submit(batcher, 1, 0.0f);
  while (run.started.load() == 0) std::this_thread::yield();
  std::vector<std::future<Answer>> answers;
  answers.push_back(submit(batcher, 3, 1.0f));
  answers.push_back(submit(batcher, 2, 2.0f));            // 3 + 2 > 4: a batch of its own
  answers.push_back(submit(batcher, 1, 3.0f, /*width=*/5));  // another shape: a batch of its own
  answers.push_back(submit(batcher, 1, 4.0f, /*width=*/5));
  run.release();
  blocker.get();
  for (auto& f : answers) ASSERT_TRUE(f.get().error.empty());
  std::lock_guard<std::mutex> lock(run.mutex);
  EXPECT_EQ(run.batch_rows, (std::vector<int64_t>{1, 3, 2, 2}));
  for (int64_t rows : run.batch_rows) EXPECT_LE(rows, 4);
  // The batch-size histogram: runs of at most 1, 2 and 4 rows (cumulative), 8 rows.
  const BatcherStats stats = batcher.stats();
  EXPECT_EQ(stats.runs, 4u);
  EXPECT_EQ(stats.rows, 8u);
  EXPECT_EQ(stats.batch_rows.at_most[0], 1u);
  EXPECT_EQ(stats.batch_rows.at_most[1], 3u);
  EXPECT_EQ(stats.batch_rows.at_most[2], 4u);
  EXPECT_EQ(stats.batch_rows.count, 4u);
  EXPECT_EQ(stats.batch_rows.sum, 8.0);
  // Every request waited and every run took some time: one observation each.
  EXPECT_EQ(stats.queue_seconds.count, 5u);
  EXPECT_EQ(stats.compute_seconds.count, 4u);
  EXPECT_EQ(stats.compute_seconds.at_most.size(), BatcherStats::kSecondsBounds.size());
  EXPECT_EQ(stats.runs_by_device, (std::map<std::string, uint64_t>{{"cpu", 4u}}));
}

TEST(ServeBatcher, ABatchIsPaddedToThePlannedSizeAndEachRequestGetsItsOwnRows) {
  RecordingRun run;
  run.held = true;
  Batcher batcher({run.runner()}, BatchingOptions{8, std::chrono::microseconds(0), planned_batch_sizes(8)});
  auto blocker = submit(batcher, 1, 0.0f);
  while (run.started.load() == 0) std::this_thread::yield();
  auto a = submit(batcher, 2, 5.0f);
  auto b = submit(batcher, 3, 7.0f);
  run.release();
  blocker.get();
  EXPECT_EQ(a.get().values, (std::vector<float>{10.0f, 10.0f}));
  EXPECT_EQ(b.get().values, (std::vector<float>{14.0f, 14.0f, 14.0f}));
  std::lock_guard<std::mutex> lock(run.mutex);
  EXPECT_EQ(run.batch_rows, (std::vector<int64_t>{1, 8}));  // 5 rows padded to the planned 8
  EXPECT_EQ(run.padding, (std::vector<int64_t>{0, 3}));
}

TEST(ServeBatcher, AnEngineErrorReachesEveryRequestOfItsBatchAndLaterBatchesRun) {
  std::atomic<int> calls{0};
  Runner failing{"cpu", [&calls](const std::map<std::string, std::vector<Tensor>>& pieces, int64_t) {
                   if (calls++ == 0) throw std::runtime_error("the engine failed");
                   return Tensors{{"y", joined(pieces, 0).at("x")}};
                 }};
  Batcher batcher({failing}, BatchingOptions{8, std::chrono::microseconds(0), {}});
  Answer first = submit(batcher, 2, 1.0f).get();
  EXPECT_EQ(first.error, "the engine failed");
  Answer second = submit(batcher, 1, 3.0f).get();
  EXPECT_TRUE(second.error.empty());
  EXPECT_EQ(second.values, std::vector<float>{3.0f});
  EXPECT_EQ(batcher.stats().failed_runs, 1u);
}

TEST(ServeBatcher, RunsAreCountedByTheDeviceThatRanThem) {
  // Two GPUs' runs, both held: the first request occupies one, so the second goes to the other.
  RecordingRun gpu0, gpu1;
  gpu0.held = gpu1.held = true;
  Batcher batcher({gpu0.runner("0"), gpu1.runner("1")}, BatchingOptions{1, std::chrono::microseconds(0), {}});
  EXPECT_EQ(batcher.stats().runs_by_device, (std::map<std::string, uint64_t>{{"0", 0u}, {"1", 0u}}));
  auto first = submit(batcher, 1, 1.0f);
  while (gpu0.started.load() + gpu1.started.load() < 1) std::this_thread::yield();
  auto second = submit(batcher, 1, 2.0f);
  while (gpu0.started.load() + gpu1.started.load() < 2) std::this_thread::yield();
  gpu0.release();
  gpu1.release();
  ASSERT_TRUE(first.get().error.empty());
  ASSERT_TRUE(second.get().error.empty());
  EXPECT_EQ(batcher.stats().runs_by_device, (std::map<std::string, uint64_t>{{"0", 1u}, {"1", 1u}}));
}

TEST(ServeBatcher, ABatcherBeingDestroyedRunsWhatIsQueuedFirst) {
  RecordingRun run;
  run.held = true;
  std::vector<std::future<Answer>> answers;
  {
    Batcher batcher({run.runner()}, BatchingOptions{2, std::chrono::microseconds(0), {}});
    for (int i = 0; i < 6; ++i) answers.push_back(submit(batcher, 1, static_cast<float>(i)));
    while (run.started.load() == 0) std::this_thread::yield();
    std::thread releaser([&run] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      run.release();
    });
    releaser.detach();
  }  // the destructor waits for every queued request's run
  for (int i = 0; i < 6; ++i) EXPECT_EQ(answers[static_cast<size_t>(i)].get().values, std::vector<float>{2.0f * i});
}

TEST(ServeBatcher, RequestsPastMaxQueueAreRefusedAtOnceAndTheQueuedOnesRun) {
  RecordingRun run;
  run.held = true;
  BatchingOptions options{1, std::chrono::microseconds(0), {}};
  options.max_queue = 2;
  Batcher batcher({run.runner()}, options);
  auto running = submit(batcher, 1, 0.0f);  // taken by the run: not waiting
  while (run.started.load() == 0) std::this_thread::yield();
  auto first = submit(batcher, 1, 1.0f);
  auto second = submit(batcher, 1, 2.0f);
  Answer third = submit(batcher, 1, 3.0f).get();  // two wait already
  EXPECT_NE(third.error.find("--max-queue 2"), std::string::npos) << third.error;
  EXPECT_EQ(batcher.stats().refused, 1u);
  run.release();
  EXPECT_EQ(running.get().values, std::vector<float>{0.0f});
  EXPECT_EQ(first.get().values, std::vector<float>{2.0f});
  EXPECT_EQ(second.get().values, std::vector<float>{4.0f});
  // With the queue drained, a request is taken again.
  EXPECT_EQ(submit(batcher, 1, 5.0f).get().values, std::vector<float>{10.0f});
  EXPECT_EQ(batcher.stats().refused, 1u);
}

TEST(ServeBatcher, AQueueDelayGathersRequestsThatArriveWithinIt) {
  RecordingRun run;
  Batcher batcher({run.runner()}, BatchingOptions{16, std::chrono::milliseconds(300), {}});
  std::vector<std::future<Answer>> answers;
  for (int i = 0; i < 4; ++i) answers.push_back(submit(batcher, 1, 1.0f));
  for (auto& f : answers) ASSERT_TRUE(f.get().error.empty());
  std::lock_guard<std::mutex> lock(run.mutex);
  EXPECT_EQ(run.batch_rows, std::vector<int64_t>{4});
}

// A run does not wait for its last batch's answers: while the callback of a request of a batch of
// two is still answering (here: until a third batch has run, at most 10 s), the run takes and runs
// the next batch. A batch of one request is answered on the run's own thread, the others beside it.
TEST(ServeBatcher, ARunTakesItsNextBatchWhileTheLastIsAnswered) {
  RecordingRun run;
  run.held = true;
  std::atomic<std::thread::id> run_thread{};
  Runner recording = run.runner();
  Runner runner{recording.device, [&](const std::map<std::string, std::vector<Tensor>>& pieces, int64_t zero_rows) {
                  run_thread = std::this_thread::get_id();
                  return recording.run(pieces, zero_rows);
                }};
  Batcher batcher({runner}, BatchingOptions{4, std::chrono::microseconds(0), {}});
  std::promise<bool> alone_on_run_thread;
  ASSERT_TRUE(batcher
                  .submit(rows_of_value(1, 3, 1.0f), 1,
                          [&](const BatchResult&) { alone_on_run_thread.set_value(std::this_thread::get_id() == run_thread); })
                  .empty());
  while (run.started.load() == 0) std::this_thread::yield();  // held: the next two queue, one batch
  std::promise<bool> saw_third_run, beside_run_thread;
  ASSERT_TRUE(batcher
                  .submit(rows_of_value(1, 3, 2.0f), 1,
                          [&](const BatchResult& r) {
                            beside_run_thread.set_value(std::this_thread::get_id() != run_thread);
                            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
                            while (run.started.load() < 3 && std::chrono::steady_clock::now() < deadline)
                              std::this_thread::yield();
                            saw_third_run.set_value(r.error.empty() && run.started.load() >= 3);
                          })
                  .empty());
  std::future<Answer> second = submit(batcher, 1, 3.0f);
  run.release();
  EXPECT_TRUE(alone_on_run_thread.get_future().get());
  while (run.started.load() < 2) std::this_thread::yield();
  std::future<Answer> third = submit(batcher, 2, 5.0f);
  EXPECT_TRUE(beside_run_thread.get_future().get());
  EXPECT_TRUE(saw_third_run.get_future().get());
  EXPECT_EQ(second.get().values, (std::vector<float>{6.0f}));
  EXPECT_EQ(third.get().values, (std::vector<float>{10.0f, 10.0f}));
  std::lock_guard<std::mutex> lock(run.mutex);
  EXPECT_EQ(run.batch_rows, (std::vector<int64_t>{1, 2, 2}));
}

TEST(ServeBatcher, PlannedBatchSizesAndPadding) {
  EXPECT_EQ(planned_batch_sizes(1), std::vector<int64_t>{1});
  EXPECT_EQ(planned_batch_sizes(6), (std::vector<int64_t>{1, 2, 4, 6}));
  EXPECT_EQ(planned_batch_sizes(8), (std::vector<int64_t>{1, 2, 4, 8}));
  EXPECT_EQ(planned_batch_sizes(32), (std::vector<int64_t>{1, 2, 4, 8, 16, 24, 32}));
  // The top octave in quarters: 76 rows pad to 80, not 128.
  EXPECT_EQ(planned_batch_sizes(128), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 80, 96, 112, 128}));
  EXPECT_EQ(padded_rows(76, planned_batch_sizes(128)), 80);
  EXPECT_EQ(planned_batch_sizes(100), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 80, 96, 100}));
  EXPECT_EQ(planned_batch_sizes(1000),
            (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 640, 768, 896, 1000}));
  // A context keeps sixteen shapes: past that the smallest go.
  const std::vector<int64_t> large = planned_batch_sizes(1 << 20);
  EXPECT_EQ(large.size(), 16u);
  EXPECT_EQ(large.front(), 1 << 8);
  EXPECT_EQ(large.back(), 1 << 20);
  EXPECT_EQ(padded_rows(3, {1, 2, 4, 6}), 4);
  EXPECT_EQ(padded_rows(7, {1, 2, 4, 6}), 7);
  EXPECT_EQ(padded_rows(5, {}), 5);
}

}  // namespace
}  // namespace kiln::serve
