// Gathers non-overlapping channels-last patches into matrix rows (patches.h). Bound by memory:
// every thread moves one unit of up to 16 bytes, read and written in order along a patch's
// contiguous S*C run.
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/patches.h"
#include "cuda/runtime/check.h"

namespace kiln::cuda {

namespace {

// All sizes in units of U.
struct PatchUnits {
  int64_t total;        // units in the output
  int64_t run;          // one patch row's run of S*C elements
  int64_t r, ow, oh;    // patch rows per patch, patches per image row, patch rows per image
  int64_t pixel_row;    // input row of W*C elements
  int64_t image;        // input image of H*W*C elements
  int64_t step_w;       // stride_w*C elements
  int64_t step_h;       // stride_h input rows
};

template <class U>
__global__ void gather_patches_kernel(const U* __restrict__ x, U* __restrict__ out, PatchUnits p) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.total; i += step) {
    int64_t t = i / p.run;
    const int64_t j = i - t * p.run;
    const int64_t r = t % p.r;
    t /= p.r;
    const int64_t ow = t % p.ow;
    t /= p.ow;
    const int64_t oh = t % p.oh;
    const int64_t n = t / p.oh;
    out[i] = x[n * p.image + (oh * p.step_h + r) * p.pixel_row + ow * p.step_w + j];
  }
}

}  // namespace

void launch_gather_patches_nhwc(const void* x, void* patches, const PatchGeometry& g, size_t element_bytes,
                                cudaStream_t stream) {
  if (g.rows() == 0 || g.row_elements() == 0) return;
  const uint64_t es = element_bytes;
  const uint64_t run = static_cast<uint64_t>(g.s * g.c) * es, pixel_row = static_cast<uint64_t>(g.w * g.c) * es,
                 step_w = static_cast<uint64_t>(g.stride_w * g.c) * es;
  const size_t unit = pointer_unit(widest_unit(element_bytes, {run, pixel_row, step_w}), x, patches);
  PatchUnits p;
  p.run = static_cast<int64_t>(run / unit);
  p.r = g.r;
  p.ow = g.ow;
  p.oh = g.oh;
  p.pixel_row = static_cast<int64_t>(pixel_row / unit);
  p.image = g.h * p.pixel_row;
  p.step_w = static_cast<int64_t>(step_w / unit);
  p.step_h = g.stride_h;
  p.total = g.rows() * g.r * p.run;
  with_unit(unit, [&](auto tag) {
    using U = decltype(tag);
    gather_patches_kernel<U><<<capped_blocks((p.total + 255) / 256), 256, 0, stream>>>(static_cast<const U*>(x),
                                                                                        static_cast<U*>(patches), p);
    KILN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace kiln::cuda
