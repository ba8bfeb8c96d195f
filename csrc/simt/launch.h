// The emulated `kernel<<<grid, block, shmem, stream>>>(args...)`: SYNCBN_LAUNCH builds a Launch<kernel>,
// whose call converts the arguments to the kernel's parameter types on the host (raw pointers become
// checked pointers here), checks the configuration against the device's limits, then runs every block
// to completion on fibers (executor.cpp). A configuration the device would refuse does not run and
// sets the error cudaGetLastError returns (C10_CUDA_KERNEL_LAUNCH_CHECK raises it); a fault while
// running (out-of-bounds or misaligned access, divergent barrier, deadlock) raises c10::Error at once.
#pragma once
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "runtime_api.h"

namespace syncbn::simt {

struct KernelLaunch {
  const char* name;    // e.g. "stats_channels_last_kernel<float, 4>"
  const void* key;     // the kernel's address (cudaFuncSetAttribute)
  void (*invoke)(const void* params);  // runs the kernel body once, for the current emulated thread
  const void* params;
};

void launch_kernel(const KernelLaunch& k, dim3 grid, dim3 block, size_t shmem);

namespace detail {
// "Kernel = ns::{anonymous}::stats_kernel<float, 4>" (GCC) or "Kernel = &ns::stats_kernel<float, 4>"
// (Clang) inside a __PRETTY_FUNCTION__ -> "stats_kernel<float, 4>".
std::string kernel_name_from_signature(const char* pretty_function);

template <auto Kernel>
const char* kernel_name() {
  static const std::string name = kernel_name_from_signature(__PRETTY_FUNCTION__);
  return name.c_str();
}

// Instantiated with every launched kernel; its initialisation (at load) names the kernel's address.
template <auto Kernel>
struct KernelName {
  static inline const bool registered =
      register_kernel_name(reinterpret_cast<const void*>(Kernel), kernel_name<Kernel>());
};

template <auto Kernel, typename... Params, typename... Args>
void launch_as(void (*)(Params...), dim3 grid, dim3 block, size_t shmem, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "kernel launched with the wrong number of arguments");
  static_assert((std::is_trivially_copyable_v<std::decay_t<Params>> && ...),
                "CUDA kernel parameters must be trivially copyable");
  (void)KernelName<Kernel>::registered;
  using Tuple = std::tuple<std::decay_t<Params>...>;
  const Tuple params(std::forward<Args>(args)...);  // the host-side conversions of a real launch
  const KernelLaunch k{kernel_name<Kernel>(), reinterpret_cast<const void*>(Kernel),
                       [](const void* p) { std::apply(Kernel, *static_cast<const Tuple*>(p)); }, &params};
  launch_kernel(k, grid, block, shmem);
}
}  // namespace detail

template <auto Kernel>
struct Launch {
  dim3 grid;
  dim3 block;
  size_t shmem;
  cudaStream_t stream;

  template <typename... Args>
  void operator()(Args&&... args) const {
    detail::launch_as<Kernel>(Kernel, grid, block, shmem, std::forward<Args>(args)...);
  }
};

}  // namespace syncbn::simt
