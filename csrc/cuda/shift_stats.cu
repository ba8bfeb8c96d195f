// batch_norm_shift_stats / batch_norm_unshift_stats (contract: csrc/ops.h) on the device: one thread per channel,
// float64 throughout, no host synchronisation. The same arithmetic, in the same order, as csrc/cpu/shift_stats.cpp.
#include <ATen/ops/empty.h>

#include "launch.cuh"
#include "occupancy.cuh"
#include "../ops.h"

namespace syncbn::cuda {
namespace detail {
namespace {

constexpr int kShiftThreads = 128;

// v - v is 0 for every finite v and NaN for inf and NaN (one spelling for nvcc and the emulation's host compiler).
__device__ __forceinline__ bool finite(double v) { return v - v == 0.0; }

__global__ void shift_stats_kernel(SYNCBN_PTR(const double) stats, SYNCBN_PTR(const double) shift, int64_t C,
                                   SYNCBN_PTR(double) out) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const double n = stats[0];
  if (c == 0) out[0] = n;
  if (c >= C) return;
  // An empty rank adds exact zeros, even where K is not finite.
  const double d = n > 0.0 ? stats[1 + c] - shift[c] : 0.0;
  out[1 + c] = n > 0.0 ? n * d : 0.0;
  out[1 + C + c] = n > 0.0 ? stats[1 + C + c] + n * d * d : 0.0;
}

__global__ void unshift_stats_kernel(SYNCBN_PTR(const double) sums, SYNCBN_PTR(const double) shift, int64_t C,
                                     double max_ratio, SYNCBN_PTR(double) row, SYNCBN_PTR(bool) exact) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const double n = sums[0];
  if (c == 0) row[0] = n;
  if (c >= C) return;
  if (!(n > 0.0)) {  // empty group: zeros (exact); a negative or NaN count: the gather decides
    row[1 + c] = 0.0;
    row[1 + C + c] = 0.0;
    exact[c] = n == 0.0;
    return;
  }
  const double s1 = sums[1 + c];
  const double s2 = sums[1 + C + c];
  const double q = s1 / n;
  const double m2 = s2 - s1 * q;
  const double mean = shift[c] + q;
  row[1 + c] = mean;
  row[1 + C + c] = m2 > 0.0 ? m2 : 0.0;
  exact[c] = finite(s2) && finite(mean) && s2 <= max_ratio * m2;
}

dim3 channel_grid(int64_t C) {
  // At least one block even for C == 0: thread 0 still writes the count.
  return dim3(unsigned(std::max<int64_t>(ceil_div(C, kShiftThreads), 1)));
}

}  // namespace
}  // namespace detail

at::Tensor batch_norm_shift_stats(const at::Tensor& stats, const at::Tensor& shift) {
  using namespace detail;
  constexpr const char* kOp = "batch_norm_shift_stats";
  TORCH_CHECK(stats.defined() && simt::is_device_tensor(stats), kOp, ": stats must be a CUDA tensor");
  const int64_t C = checks::shifted_sums(stats, shift, kOp, "stats");
  const c10::cuda::CUDAGuard guard(stats.device());
  const at::Tensor s = stats.contiguous();
  const at::Tensor k = shift.contiguous();
  at::Tensor out = at::empty({2 * C + 1}, s.options());
  SYNCBN_LAUNCH(channel_grid(C), kShiftThreads, 0, c10::cuda::getCurrentCUDAStream(), shift_stats_kernel)(
      s.const_data_ptr<double>(), k.const_data_ptr<double>(), C, out.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

std::tuple<at::Tensor, at::Tensor> batch_norm_unshift_stats(const at::Tensor& sums, const at::Tensor& shift,
                                                            double max_ratio) {
  using namespace detail;
  constexpr const char* kOp = "batch_norm_unshift_stats";
  TORCH_CHECK(sums.defined() && simt::is_device_tensor(sums), kOp, ": sums must be a CUDA tensor");
  const int64_t C = checks::shifted_sums(sums, shift, kOp, "sums");
  const c10::cuda::CUDAGuard guard(sums.device());
  const at::Tensor s = sums.contiguous();
  const at::Tensor k = shift.contiguous();
  at::Tensor row = at::empty({2 * C + 1}, s.options());
  at::Tensor exact = at::empty({C}, s.options().dtype(at::kBool));
  SYNCBN_LAUNCH(channel_grid(C), kShiftThreads, 0, c10::cuda::getCurrentCUDAStream(), unshift_stats_kernel)(
      s.const_data_ptr<double>(), k.const_data_ptr<double>(), C, max_ratio, row.data_ptr<double>(),
      exact.data_ptr<bool>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {row, exact};
}

void shift_stats_occupancy(std::vector<KernelOccupancy>& out) {
  using namespace detail;
  add_occupancy(out, "shift_stats", shift_stats_kernel, kShiftThreads);
  add_occupancy(out, "unshift_stats", unshift_stats_kernel, kShiftThreads);
}

}  // namespace syncbn::cuda
