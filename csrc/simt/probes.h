// Probe kernels for the emulator's own tests (tests/syncbn/test_simt.py): each exercises one emulated
// mechanism (indices, barrier, shuffles, atomics, dynamic shared memory, launch limits, faults) with
// results the tests know from the CUDA programming guide, independently of how the emulator works.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace syncbn::simt::probes {

// out: int64 [total threads, 12] = threadIdx, blockIdx, blockDim, gridDim (x, y, z each) per thread,
// row = global linear thread index (blocks x-fastest, threads x-fastest).
void indices(at::Tensor& out, const std::vector<int64_t>& grid, const std::vector<int64_t>& block);

// out: int64 [blocks, threads, rounds]. In round r every thread stores seed * (r + 1) + 1000 * block + tid
// in shared memory, waits at __syncthreads, records the value its left neighbour (tid - 1 mod threads)
// stored, and waits again before the next round overwrites it.
void barrier(at::Tensor& out, int64_t rounds, int64_t seed);

// One warp-shuffle per thread of a one-block launch of values.numel() threads: out[t] =
// __shfl_<mode>_sync(masks[t], values[t], lane_arg, width); threads with masks[t] == 0 do not call it.
// values/out: float64, float32 or int32; masks: int64 (32-bit masks).
void shuffle(const at::Tensor& values, at::Tensor& out, const std::string& mode, int64_t lane_arg, int64_t width,
             const at::Tensor& masks);

// count (int64 [1]) and total (float64 [1]) each get atomicAdd(1) and atomicAdd(0.5) from every thread.
void atomic_add(at::Tensor& count, at::Tensor& total, int64_t blocks, int64_t threads);

// out: int64 [blocks, threads, 2]. Each block gets `bytes` of dynamic shared memory: a thread reads its
// slot before writing it (the poison, -1), writes 1000 * block + tid, and after a barrier reads its
// neighbour's. index >= 0: thread 0 then also reads int64 slot `index` (out of bounds: a fault).
void dynamic_shared(at::Tensor& out, int64_t bytes, int64_t index);

// Like dynamic_shared, for a static __shared__ array (threads <= 1024): slot reads before any write of
// the block give the poison (-1), never what an earlier block or launch stored.
void static_shared(at::Tensor& out);

// out[block * threads + t] = the place of that thread in the order the launch ran its threads (a
// ticket from atomicAdd; threads never wait, so each runs to its end before the next starts).
void order(at::Tensor& out, int64_t blocks, int64_t threads);

// A kernel whose correctness depends on a synchronisation, with it (fixed) or without it (the bug):
// "syncthreads" (out[t] = the value thread t-1 stored, thread 0 its own), "syncwarp" (one warp; out[0] =
// sum of 100 + lane), "shuffle" (the same; the bug: a shuffle instead of the __syncwarp), "last_warp"
// (out[0] = sum of 100 + t over the block, finished by the last warp), "global_write" (out[t] = t; the
// bug: every thread writes out[0]). Returns out (int64, blocks x threads, -7 where nothing was written).
at::Tensor race(const std::string& kind, bool fixed, int64_t threads, int64_t blocks);

// Launches a one-thread kernel with this configuration (after opting in to `optin` bytes of dynamic
// shared memory when optin > 0); returns (cudaGetLastError, its detail, whether the kernel ran).
std::tuple<int64_t, std::string, bool> launch(const std::vector<int64_t>& grid, const std::vector<int64_t>& block,
                                              int64_t shmem, int64_t optin);

// An int64 tensor of n values from at::empty, of which a kernel writes the first half (= index):
// the rest must read as the poison pattern (-1).
at::Tensor half_written(int64_t n);

// Runs a kernel with the bug `kind` (see probes.cu for the list); raises the emulator's report.
void fault(const std::string& kind);

// The names `fault` accepts.
std::vector<std::string> fault_kinds();

}  // namespace syncbn::simt::probes
