// Kernels kiln writes while it builds an engine: CUDA C++ generated for one layer, compiled with
// NVRTC for the GPU at hand into a cubin, and loaded from that cubin. The cubin is what the
// engine file keeps (as a timing-cache entry, text: base64), so loading an engine compiles
// nothing, and a timing cache file keeps it too, so a rebuild compiles nothing either.
//
// Generated sources include only the headers kiln embeds in itself (kernel_headers()): the
// float math every kiln kernel shares (ir/float_math.h), so a generated kernel computes bit for
// bit what the kernels compiled with kiln compute.
#pragma once

#include <cuda_runtime.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln::cuda {

struct EmbeddedHeader {
  const char* name;  // as the generated sources include it: "ir/float_math.h"
  const char* text;
};
// The headers a generated source may include (src/cuda/runtime/kernel_headers.cc.in).
const std::vector<EmbeddedHeader>& kernel_headers();

// NVRTC's version, "13.0": part of a generated kernel's cache key.
std::string runtime_compiler_version();

// Compiles `source` for `device`'s architecture (sm_XY, the cubin for exactly this GPU) with
// the options of kiln's own kernels (nvcc's defaults: -O3, fused multiply-add on, IEEE division
// and square root). Throws kiln::Error (kInternal) naming `name` with NVRTC's log when it does
// not compile, and (kDevice) when NVRTC cannot be used.
std::string compile_to_cubin(const std::string& source, const std::string& name, const cudaDeviceProp& device);

// Compiles sources with compile_to_cubin on worker threads (NVRTC compiles programs in
// parallel), so that a build goes on lowering and timing other layers meanwhile. A result's
// future holds the cubin, or the compile's kiln::Error. The threads start with the first
// submission; destroying the queue drops what has not started and waits for what has.
class CompileQueue {
 public:
  CompileQueue(const cudaDeviceProp& device, int threads);
  ~CompileQueue();
  CompileQueue(const CompileQueue&) = delete;
  CompileQueue& operator=(const CompileQueue&) = delete;

  std::shared_future<std::string> submit(std::string source, std::string name);
  int threads() const { return threads_; }

 private:
  void work();

  const cudaDeviceProp device_;
  const int threads_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<std::string()>> waiting_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// A loaded cubin whose kernels can be launched (cudaLaunchKernel takes them). Unloaded when
// destroyed.
class LoadedCubin {
 public:
  explicit LoadedCubin(const std::string& cubin);
  ~LoadedCubin();
  LoadedCubin(const LoadedCubin&) = delete;
  LoadedCubin& operator=(const LoadedCubin&) = delete;

  // The kernel `name` (an extern "C" __global__ function); throws kDevice when it is absent.
  const void* kernel(const char* name) const;

 private:
  cudaLibrary_t library_ = nullptr;
};

// The hash of `text` (ir/hash.h), as 16 hex digits: the cache keys of generated sources.
std::string source_hash(const std::string& text);
// Base64 (RFC 4648, with padding) of bytes, and back; decoding throws kInvalidArgument on
// anything that is not base64.
std::string base64_encode(const std::string& bytes);
std::string base64_decode(const std::string& text);

}  // namespace kiln::cuda
