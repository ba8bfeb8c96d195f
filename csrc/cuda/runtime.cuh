// The device surface the SyncBN kernels are written against, from one of two providers:
//  - nvcc (the real build): the CUDA runtime and c10's CUDA helpers;
//  - the host compiler with -DSYNCBN_SIMT (the emulated build, csrc/simt/): the same names implemented
//    by a SIMT emulation on the CPU, so the kernel sources in this folder run unchanged on a machine
//    without a GPU, with every tensor access bounds-checked.
// The two macros below are the only spelling the kernels use that differs from plain CUDA C++:
//  - SYNCBN_PTR(T): a kernel-side pointer to T. Under nvcc exactly `T* __restrict__`; emulated, a
//    checked pointer that knows the allocation it points into.
//  - SYNCBN_LAUNCH(grid, block, shmem, stream, kernel)(args...): under nvcc exactly
//    `kernel<<<grid, block, shmem, stream>>>(args...)`; emulated, the same launch run on CPU fibers.
#pragma once

#if defined(SYNCBN_SIMT)
#if defined(__CUDACC__)
#error "SYNCBN_SIMT is the host-compiler emulation of these kernels; do not define it under nvcc"
#endif
#include "../simt/simt.h"

#define SYNCBN_PTR(...) ::syncbn::simt::Ptr<__VA_ARGS__>
#define SYNCBN_LAUNCH(grid, block, shmem, stream, ...) \
  ::syncbn::simt::Launch<__VA_ARGS__> { (grid), (block), (shmem), (stream) }

#else
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#define SYNCBN_PTR(...) __VA_ARGS__* __restrict__
#define SYNCBN_LAUNCH(grid, block, shmem, stream, ...) __VA_ARGS__<<<(grid), (block), (shmem), (stream)>>>

namespace syncbn::simt {
// Whole-object loads and stores through a kernel pointer (vector accesses: LDG.128 / STG.128).
template <typename V, typename T>
__device__ __forceinline__ V device_load(const T* p) {
  return *reinterpret_cast<const V*>(p);
}
template <typename V, typename T>
__device__ __forceinline__ void device_store(T* p, const V& v) {
  *reinterpret_cast<V*>(p) = v;
}
// The launch's dynamic shared memory (its size is the launch's shmem argument).
template <typename T>
__device__ __forceinline__ T* dynamic_shared() {
  extern __shared__ __align__(16) unsigned char syncbn_dynamic_shared[];
  return reinterpret_cast<T*>(syncbn_dynamic_shared);
}
}  // namespace syncbn::simt
#endif

#include <ATen/core/Tensor.h>

namespace syncbn::simt {
// Tensors the kernels may read and write: CUDA tensors, or (emulated) CPU tensors playing device memory.
inline bool is_device_tensor(const at::Tensor& t) {
#if defined(SYNCBN_SIMT)
  return t.is_cpu();
#else
  return t.is_cuda();
#endif
}
}  // namespace syncbn::simt
