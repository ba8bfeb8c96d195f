// kernel_occupancy (occupancy.h): the per-file lists, gathered on one device.
#include "occupancy.h"
#include "runtime.cuh"

namespace syncbn::cuda {

std::vector<KernelOccupancy> kernel_occupancy(int device) {
#if defined(SYNCBN_SIMT)
  (void)device;
#else
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
#endif
  std::vector<KernelOccupancy> out;
  stats_occupancy(out);
  gather_stats_occupancy(out);
  exchange_stats_occupancy(out);
  elemt_occupancy(out);
  backward_reduce_occupancy(out);
  backward_elemt_occupancy(out);
  return out;
}

}  // namespace syncbn::cuda
