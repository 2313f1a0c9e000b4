// KILN_HOST_DEVICE marks a function that the CPU engine and the CUDA kernels both call (an op's
// math, defined once): __host__ __device__ where nvcc compiles it, a plain inline function
// elsewhere.
#pragma once

#ifdef __CUDACC__
#define KILN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KILN_HOST_DEVICE inline
#endif
