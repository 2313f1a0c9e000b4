// Calibration histograms on the GPU, on the public Context alone (its device buffers and
// enqueue) and kernels of this module's own: every activation of a calibration batch stays on the
// device, where two kernels per tensor find its largest |x| and count |x| into the 2048 bins of
// AbsHistogram (whose range the host grows first, as AbsHistogram::add does); only
// the counts come back. Copying every layer's output to the host and binning it there took about
// 1 s per batch of 32 ResNet-50 images (1.4 GB of activations); on the GPU it is two passes over
// them at memory speed. The counts are the host histogram's, bin for bin (the same double
// arithmetic: tests/gpu/test_gpu_int8.py compares the calibration caches).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "calibration/calibration.h"

namespace kiln::calibration {

class GpuHistogramCollector {
 public:
  // `context` runs a float32 engine on GPU `gpu`; `outputs` are the float32 outputs whose
  // histograms are collected.
  GpuHistogramCollector(Context& context, std::vector<std::string> outputs, int gpu);
  ~GpuHistogramCollector();
  GpuHistogramCollector(const GpuHistogramCollector&) = delete;
  GpuHistogramCollector& operator=(const GpuHistogramCollector&) = delete;

  // Runs one batch (a tensor for every input, by name, at the context's input shapes) and adds
  // every output's |x| to histograms[output name].
  void add_batch(const std::map<std::string, Tensor>& batch, std::map<std::string, AbsHistogram>& histograms);

 private:
  Context& context_;
  std::vector<std::string> outputs_;
  int gpu_;
  void* stream_ = nullptr;            // cudaStream_t
  float* max_abs_ = nullptr;          // [outputs] on the device
  uint64_t* counts_ = nullptr;        // [outputs][AbsHistogram::kBins] on the device
  std::vector<float> host_max_;
  std::vector<uint64_t> host_counts_;
};

}  // namespace kiln::calibration
