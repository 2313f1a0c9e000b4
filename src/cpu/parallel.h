// The CPU engine's parallel loops, on a pool of kiln's own threads.
//
// A loop is split into chunks that the calling thread and the pool's workers claim one at a
// time, so a thread that loses its core to another process holds up one chunk at most, not a
// fixed share of the loop. Between loops the workers spin for a moment (the next layer's loop
// usually follows within microseconds) and then sleep, so an idle or preempted engine leaves
// its cores to others: OpenMP's spinning barriers made two-thread runs collapse on a shared
// two-core machine (docs/design/cpu-gemm.md, "Threads").
#pragma once

#include <cstdint>
#include <functional>

namespace kiln::cpu {

// body(begin, end) over consecutive ranges that cover [0, n) once.
using RangeBody = std::function<void(int64_t begin, int64_t end)>;

// Runs body over [0, n) and returns when every range has run; the first exception a range
// throws is rethrown here, after the others have finished. Ranges are `chunk` indices long
// (0: about four per thread). Runs on the calling thread alone when `parallel` is false, when
// there is one thread or one index, inside another parallel loop, and while another thread's
// loop holds the pool (engines running at once on several threads share the cores that way).
void parallel_for(int64_t n, const RangeBody& body, bool parallel = true, int64_t chunk = 0);

// body(i) for every i in [0, n), as parallel_for.
template <class Body>
void parallel_for_each(int64_t n, bool parallel, Body&& body, int64_t chunk = 0) {
  parallel_for(
      n, [&body](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) body(i);
      },
      parallel, chunk);
}

// The threads a parallel loop may use, the calling thread included.
int thread_count();

// Sets thread_count() for the whole process (0: the CPUs this process may run on). Waits for a
// running loop to finish first.
void set_thread_count(int threads);

}  // namespace kiln::cpu
