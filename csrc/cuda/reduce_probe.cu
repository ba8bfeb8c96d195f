// The block_reduce probe (reduce_probe.h). Emulated build only: nothing in the real extension calls it.
#if defined(SYNCBN_SIMT)
#include "reduce_probe.h"

#include <ATen/ops/empty.h>

#include "../simt/device_memory.h"
#include "reduce.cuh"

namespace syncbn::cuda::probes {
namespace {

using detail::SumPair;

__global__ void block_reduce_sum_kernel(SYNCBN_PTR(const double) values, SYNCBN_PTR(double) out, int group) {
  const int threads = int(blockDim.x * blockDim.y);
  const int tid = int(threadIdx.x + threadIdx.y * blockDim.x);
  SumPair<double, 1> s;
  s.a[0] = values[int64_t(blockIdx.x) * threads + tid];
  s.b[0] = 1.0;
  s = detail::block_reduce(s, group);
  if (tid < group) {
    out[(int64_t(blockIdx.x) * group + tid) * 2] = s.a[0];
    out[(int64_t(blockIdx.x) * group + tid) * 2 + 1] = s.b[0];
  }
}

}  // namespace

at::Tensor block_reduce_sum(const at::Tensor& values, int64_t group) {
  TORCH_CHECK(values.dim() == 2 && values.scalar_type() == at::kDouble && values.is_contiguous(),
              "block_reduce_sum: values must be contiguous float64 [blocks, threads]");
  const int64_t blocks = values.size(0), threads = values.size(1);
  TORCH_CHECK(group >= 1 && group <= 32 && (group & (group - 1)) == 0 && threads % group == 0,
              "block_reduce_sum: group must be a power of two <= 32 dividing threads");
  at::Tensor out = at::empty({blocks, group, 2}, values.options());
  simt::DeviceMemoryScope scope("block_reduce_sum", {{"values", &values}, {"out", &out}});
  SYNCBN_LAUNCH(dim3(unsigned(blocks)), dim3(unsigned(group), unsigned(threads / group)), 0, nullptr,
                block_reduce_sum_kernel)(values.const_data_ptr<double>(), out.data_ptr<double>(), int(group));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace syncbn::cuda::probes
#endif  // SYNCBN_SIMT
