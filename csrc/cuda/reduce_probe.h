// A probe kernel around block_reduce (reduce.cuh) for the kernel tests: every streaming kernel launches
// exactly kThreads threads, so only a probe can show what block_reduce does with other block sizes.
// Compiled into the emulated build only (tests/syncbn/test_cuda_kernel_fixes.py).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace syncbn::cuda::probes {

// values: float64 [blocks, threads]. One launch of `blocks` blocks of (group, threads / group) threads; thread
// t of block b holds (values[b, t], 1) and block_reduce(., group) merges the threads of each column
// t % group. Returns float64 [blocks, group, 2]: per column, the sum of its values and its thread count.
at::Tensor block_reduce_sum(const at::Tensor& values, int64_t group);

}  // namespace syncbn::cuda::probes
