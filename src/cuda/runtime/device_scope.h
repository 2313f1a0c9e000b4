// The GPU an engine lives on. CUDA's current device belongs to the calling thread, and every
// allocation, stream, library handle and launch goes to it; an engine built or loaded for GPU N
// (BuildOptions::gpu) makes N current for each call into it and gives the thread its own device
// back afterwards, so a program may drive engines on several GPUs from one thread, and a thread
// that last used another GPU still runs the engine where its memory is.
#pragma once

namespace kiln::cuda {

// Throws kInvalidArgument naming `gpu` and the devices this process sees unless `gpu` is one of
// them.
void check_gpu_index(int gpu);

class DeviceScope {
 public:
  // Makes `gpu` current (checked by check_gpu_index) until the scope ends. `checked` false (for
  // destructors, which throw nothing): a failure leaves the device as it was.
  explicit DeviceScope(int gpu, bool checked = true);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;  // the thread's device before; -1: unchanged
};

}  // namespace kiln::cuda
