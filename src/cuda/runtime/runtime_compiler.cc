#include "cuda/runtime/runtime_compiler.h"

#include <nvrtc.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "cuda/runtime/check.h"
#include "ir/hash.h"
#include "kiln/error.h"

namespace kiln::cuda {

namespace {

[[noreturn]] void throw_nvrtc(nvrtcResult status, const char* call, const std::string& name) {
  throw Error(ErrorKind::kDevice, std::string("NVRTC ") + call + " failed for " + name + ": " + nvrtcGetErrorString(status));
}

// Owns an nvrtcProgram.
struct Program {
  nvrtcProgram handle = nullptr;
  ~Program() {
    if (handle) nvrtcDestroyProgram(&handle);
  }
};

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

std::string runtime_compiler_version() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor);
}

std::string compile_to_cubin(const std::string& source, const std::string& name, const cudaDeviceProp& device) {
  std::vector<const char*> header_texts, header_names;
  for (const EmbeddedHeader& h : kernel_headers()) {
    header_names.push_back(h.name);
    header_texts.push_back(h.text);
  }
  Program program;
  const std::string file = name + ".cu";
  if (nvrtcResult s = nvrtcCreateProgram(&program.handle, source.c_str(), file.c_str(), static_cast<int>(header_texts.size()),
                                         header_texts.data(), header_names.data());
      s != NVRTC_SUCCESS)
    throw_nvrtc(s, "nvrtcCreateProgram", name);
  // sm_XY, not compute_XY: a cubin (SASS) for this GPU, so that loading JIT-compiles nothing.
  const std::string arch = "--gpu-architecture=sm_" + std::to_string(device.major) + std::to_string(device.minor);
  const char* options[] = {arch.c_str(), "--std=c++17", "--fmad=true", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"};
  const nvrtcResult compiled = nvrtcCompileProgram(program.handle, static_cast<int>(std::size(options)), options);
  if (compiled != NVRTC_SUCCESS) {
    size_t log_size = 0;
    std::string log;
    if (nvrtcGetProgramLogSize(program.handle, &log_size) == NVRTC_SUCCESS && log_size > 1) {
      log.resize(log_size);
      if (nvrtcGetProgramLog(program.handle, log.data()) != NVRTC_SUCCESS) log.clear();
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    }
    throw Error(ErrorKind::kInternal, "generated kernel " + name + " does not compile (NVRTC: " +
                                          nvrtcGetErrorString(compiled) + "):\n" + log);
  }
  size_t size = 0;
  if (nvrtcResult s = nvrtcGetCUBINSize(program.handle, &size); s != NVRTC_SUCCESS) throw_nvrtc(s, "nvrtcGetCUBINSize", name);
  std::string cubin(size, '\0');
  if (nvrtcResult s = nvrtcGetCUBIN(program.handle, cubin.data()); s != NVRTC_SUCCESS) throw_nvrtc(s, "nvrtcGetCUBIN", name);
  return cubin;
}

CompileQueue::CompileQueue(const cudaDeviceProp& device, int threads) : device_(device), threads_(std::max(threads, 1)) {}

CompileQueue::~CompileQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    waiting_.clear();  // their futures report a broken promise to anyone still holding one
  }
  ready_.notify_all();
  for (std::thread& t : workers_) t.join();
}

std::shared_future<std::string> CompileQueue::submit(std::string source, std::string name) {
  std::packaged_task<std::string()> task(
      [this, source = std::move(source), name = std::move(name)] { return compile_to_cubin(source, name, device_); });
  std::shared_future<std::string> result = task.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waiting_.push_back(std::move(task));
    if (static_cast<int>(workers_.size()) < threads_) workers_.emplace_back([this] { work(); });
  }
  ready_.notify_one();
  return result;
}

void CompileQueue::work() {
  for (;;) {
    std::packaged_task<std::string()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !waiting_.empty(); });
      if (stopping_) return;
      task = std::move(waiting_.front());
      waiting_.pop_front();
    }
    task();  // an exception goes into the task's future
  }
}

LoadedCubin::LoadedCubin(const std::string& cubin) {
  KILN_CUDA_CHECK(cudaLibraryLoadData(&library_, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
}

LoadedCubin::~LoadedCubin() {
  if (library_) cudaLibraryUnload(library_);
}

const void* LoadedCubin::kernel(const char* name) const {
  cudaKernel_t k = nullptr;
  KILN_CUDA_CHECK(cudaLibraryGetKernel(&k, library_, name));
  return reinterpret_cast<const void*>(k);
}

std::string source_hash(const std::string& text) { return ir::hex64(ir::fnv1a(text.data(), text.size())); }

std::string base64_encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k) v = v << 8 | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out.push_back(k <= n ? kBase64[(v >> (18 - 6 * k)) & 63] : '=');
  }
  return out;
}

std::string base64_decode(const std::string& text) {
  std::array<int, 256> value;
  value.fill(-1);
  for (int k = 0; k < 64; ++k) value[static_cast<unsigned char>(kBase64[k])] = k;
  if (text.size() % 4 != 0) throw Error(ErrorKind::kInvalidArgument, "not base64: its length is not a multiple of 4");
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = 0;
    int padding = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      const bool last_group = i + 4 == text.size();
      if (c == '=' && last_group && k >= 2 && (k == 3 || text[i + 3] == '=')) {
        ++padding;
        v <<= 6;
        continue;
      }
      const int d = value[static_cast<unsigned char>(c)];
      if (d < 0 || padding) throw Error(ErrorKind::kInvalidArgument, "not base64: an unexpected character at " + std::to_string(i + k));
      v = v << 6 | static_cast<uint32_t>(d);
    }
    for (int k = 0; k < 3 - padding; ++k) out.push_back(static_cast<char>((v >> (16 - 8 * k)) & 0xff));
  }
  return out;
}

}  // namespace kiln::cuda
