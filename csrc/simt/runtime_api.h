// The host-side CUDA surface the SyncBN launchers use, emulated: dim3/uint3, cudaError_t and
// cudaGetLastError, cudaDeviceGetAttribute on the emulated device (device_props.h),
// cudaFuncSetAttribute for dynamic shared memory, cudaOccupancyMaxActiveBlocksPerMultiprocessor and
// cudaFuncGetAttributes (registers per thread), cudaGetDevice,
// streams, c10::cuda::CUDAGuard and getCurrentCUDAStream, and c10's C10_CUDA_CHECK / C10_CUDA_KERNEL_LAUNCH_CHECK. Same names and
// meanings as the real ones, so the launch code in csrc/cuda compiles unchanged.
#pragma once
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <cstddef>
#include <string>

struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorLaunchFailure = 719,
};
using cudaError = cudaError_t;

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxBlockDimX = 2,
  cudaDevAttrMaxBlockDimY = 3,
  cudaDevAttrMaxBlockDimZ = 4,
  cudaDevAttrMaxGridDimX = 5,
  cudaDevAttrMaxGridDimY = 6,
  cudaDevAttrMaxGridDimZ = 7,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxThreadsPerMultiProcessor = 39,
  cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
  cudaDevAttrMaxRegistersPerMultiprocessor = 82,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
  cudaDevAttrMaxBlocksPerMultiprocessor = 106,
  cudaDevAttrReservedSharedMemoryPerBlock = 111,
};

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

struct CUstream_st;
using cudaStream_t = CUstream_st*;

// What cudaFuncGetAttributes reports of a kernel, as far as the emulated device models it: its registers per
// thread (DeviceProps::kernel_registers), the block size it may launch with; no local memory.
struct cudaFuncAttributes {
  size_t sharedSizeBytes = 0;
  size_t constSizeBytes = 0;
  size_t localSizeBytes = 0;
  int maxThreadsPerBlock = 0;
  int numRegs = 0;
};

// The emulated device's property (the device ordinal is ignored: there is one emulated device).
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
// The one emulated device: 0.
cudaError_t cudaGetDevice(int* device);
// The error of the last launch that could not start (invalid configuration), then cleared.
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);

namespace syncbn::simt::detail {
cudaError_t func_set_attribute(const void* kernel, cudaFuncAttribute attr, int value);
cudaError_t occupancy(int* blocks, const void* kernel, int block_threads, size_t dynamic_smem);
cudaError_t func_attributes(cudaFuncAttributes* attr, const void* kernel);
// Names the kernel at `kernel` (its address) for the occupancy query, which looks up its registers per
// thread by name (DeviceProps::kernel_registers); every kernel a Launch names registers itself at load.
bool register_kernel_name(const void* kernel, const char* name);
// The name a launch registered for `kernel` ("" for a kernel no launch names).
std::string registered_name(const void* kernel);
// Why the last launch failed to start, in words (appended to C10_CUDA_CHECK's message).
const char* last_error_detail();
}  // namespace syncbn::simt::detail

// Opting a kernel in to more dynamic shared memory than shared_mem_per_block, as on the device.
template <typename F>
cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute attr, int value) {
  return ::syncbn::simt::detail::func_set_attribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// Resident blocks per SM of `kernel` on the emulated device: the least of what its thread slots, block
// slots, registers (the kernel's modelled registers per thread, allocated per warp in units of 256)
// and shared memory (dynamic plus the reserved share; static shared memory is not known here) allow.
// A kernel no launch names gets the device's default registers per thread.
template <typename F>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, F* kernel, int block_threads,
                                                          size_t dynamic_smem) {
  return ::syncbn::simt::detail::occupancy(blocks, reinterpret_cast<const void*>(kernel), block_threads, dynamic_smem);
}

// The kernel's attributes on the emulated device (above): the registers per thread the occupancy query uses.
template <typename F>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, F* kernel) {
  return ::syncbn::simt::detail::func_attributes(attr, reinterpret_cast<const void*>(kernel));
}

namespace c10::cuda {
// Host memory is the emulated device's memory: there is nothing to switch.
struct CUDAGuard {
  explicit CUDAGuard(c10::Device) {}
  explicit CUDAGuard(c10::DeviceIndex) {}
};
// Every launch runs to completion before it returns: one in-order stream.
inline cudaStream_t getCurrentCUDAStream(c10::DeviceIndex = -1) { return nullptr; }
}  // namespace c10::cuda

#define C10_CUDA_CHECK(EXPR)                                                                           \
  do {                                                                                                 \
    const cudaError_t syncbn_simt_err = (EXPR);                                                        \
    TORCH_CHECK(syncbn_simt_err == cudaSuccess, "CUDA error: ", cudaGetErrorString(syncbn_simt_err), \
                " (emulated: ", ::syncbn::simt::detail::last_error_detail(), ")");                   \
  } while (0)

#define C10_CUDA_KERNEL_LAUNCH_CHECK() C10_CUDA_CHECK(cudaGetLastError())
