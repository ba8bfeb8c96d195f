// add_occupancy: the query behind kernel_occupancy (occupancy.h), for the .cu files that list kernels.
#pragma once
#include "occupancy.h"
#include "runtime.cuh"

namespace syncbn::cuda {

namespace detail {

// Appends `kernel`'s occupancy on the current device: the query resident_blocks (launch.cuh) sizes its
// grids with. Emulated: the emulated device's model of it (csrc/simt/runtime_api.h), whose registers per
// thread are a parameter of the device (ptxas chooses them on a GPU).
template <typename Kernel>
void add_occupancy(std::vector<KernelOccupancy>& out, const char* name, Kernel kernel, int block_threads) {
  int device = 0;
  int blocks = 0, per_sm = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, block_threads, 0));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  cudaFuncAttributes attr{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  out.push_back({name, block_threads, blocks, per_sm, attr.numRegs, int(attr.localSizeBytes),
                 reinterpret_cast<const void*>(kernel)});
}

}  // namespace detail

}  // namespace syncbn::cuda
