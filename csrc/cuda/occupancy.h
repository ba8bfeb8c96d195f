// Resident blocks per SM of each SyncBN kernel on a device (cudaOccupancyMaxActiveBlocksPerMultiprocessor),
// for `make gpu-check`'s report: the same query launch.cuh's resident_blocks sizes each kernel's grid
// with, so the report shows what the grids are sized for (register pressure keeps the 16-bit kernels,
// ~100 registers per thread, to 2 blocks of 256 threads per SM on sm_90). Each .cu file lists
// its own kernels (they live in anonymous namespaces) with add_occupancy (occupancy.cuh); occupancy.cu
// gathers the lists. Plain C++: csrc/bindings.cpp includes it.
#pragma once
#include <string>
#include <vector>

namespace syncbn::cuda {

struct KernelOccupancy {
  std::string kernel;      // name<dtype, vector width> as the dispatch instantiates it
  int block_threads;       // threads per block of its launches
  int blocks_per_sm;       // resident blocks per SM
  int max_threads_per_sm;  // the SM's thread slots
  int registers;           // per thread (emulated: the emulated device's parameter)
  int local_bytes;         // per thread, spills included (emulated: 0)
  const void* function;    // the kernel's address (the emulated build looks its launch-log name up by it)
};

void stats_occupancy(std::vector<KernelOccupancy>& out);
void gather_stats_occupancy(std::vector<KernelOccupancy>& out);
void exchange_stats_occupancy(std::vector<KernelOccupancy>& out);
void elemt_occupancy(std::vector<KernelOccupancy>& out);
void backward_reduce_occupancy(std::vector<KernelOccupancy>& out);
void backward_elemt_occupancy(std::vector<KernelOccupancy>& out);

// Every kernel's occupancy on CUDA device `device` (fp32 and bf16 instantiations, both layouts, finalizers).
std::vector<KernelOccupancy> kernel_occupancy(int device);

}  // namespace syncbn::cuda
