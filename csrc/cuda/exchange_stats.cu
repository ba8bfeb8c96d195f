// The forward exchange's three C-sized ops (contract: csrc/ops.h) on the device: one thread per channel, float64
// throughout, no host synchronisation. The same arithmetic, in the same order, as csrc/cpu/exchange_stats.cpp,
// which is batch_norm_gather_stats' merge with sums over the ranks in place of its loop over gathered rows.
#include "merge.cuh"
#include "occupancy.cuh"
#include "../ops.h"

namespace syncbn::cuda {
namespace detail {
namespace {

__global__ void mean_sums_kernel(SYNCBN_PTR(const double) stats, int64_t C, SYNCBN_PTR(double) out) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const double n = stats[0];
  if (c == 0) out[0] = n;
  if (c >= C) return;
  out[1 + c] = n > 0.0 ? n * stats[1 + c] : 0.0;  // an empty rank adds exact zeros
}

__global__ void deviation_sums_kernel(SYNCBN_PTR(const double) stats, SYNCBN_PTR(const double) sums, int64_t C,
                                      SYNCBN_PTR(double) out) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const double n = stats[0];
  const double total = sums[0];
  if (n > 0.0 && total > 0.0) {
    const double d = stats[1 + c] - sums[1 + c] / total;
    out[c] = stats[1 + C + c] + n * d * d;
  } else {
    out[c] = 0.0;
  }
}

// The merged row [N, S/N, m2] -> outputs; N < 0 or NaN (a caller bug: the CPU op raises) gives NaN.
template <typename acc_t, typename run_t>
__global__ void reduced_stats_kernel(SYNCBN_PTR(const double) sums, SYNCBN_PTR(const double) m2, int64_t C,
                                     SYNCBN_PTR(acc_t) mean_out, SYNCBN_PTR(acc_t) invstd_out,
                                     SYNCBN_PTR(double) count_out, SYNCBN_PTR(run_t) running_mean,
                                     SYNCBN_PTR(run_t) running_var, SYNCBN_PTR(const int64_t) num_batches,
                                     double momentum, double eps) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const double n = sums[0];
  const bool valid = n >= 0.0;
  if (c == 0) *count_out = valid ? n : ::nan("");
  if (c >= C) return;
  const bool any = valid && n > 0.0;
  store_merged<acc_t, run_t>(c, valid, n, any ? sums[1 + c] / n : 0.0, any ? m2[c] : 0.0, mean_out, invstd_out,
                             running_mean, running_var, num_batches, momentum, eps);
}

}  // namespace
}  // namespace detail

at::Tensor batch_norm_mean_sums(const at::Tensor& stats) {
  using namespace detail;
  constexpr const char* kOp = "batch_norm_mean_sums";
  TORCH_CHECK(stats.defined() && simt::is_device_tensor(stats), kOp, ": stats must be a CUDA tensor");
  const int64_t C = checks::packed_stats(stats, kOp);
  const c10::cuda::CUDAGuard guard(stats.device());
  const at::Tensor s = stats.contiguous();
  at::Tensor out = at::empty({C + 1}, s.options());
  SYNCBN_LAUNCH(merge_grid(C), kMergeThreads, 0, c10::cuda::getCurrentCUDAStream(), mean_sums_kernel)(
      s.const_data_ptr<double>(), C, out.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor batch_norm_deviation_sums(const at::Tensor& stats, const at::Tensor& mean_sums) {
  using namespace detail;
  constexpr const char* kOp = "batch_norm_deviation_sums";
  TORCH_CHECK(stats.defined() && simt::is_device_tensor(stats), kOp, ": stats must be a CUDA tensor");
  const int64_t C = checks::packed_stats(stats, kOp);
  checks::mean_sums(mean_sums, C, stats.device(), kOp, "stats");
  const c10::cuda::CUDAGuard guard(stats.device());
  const at::Tensor s = stats.contiguous();
  const at::Tensor m = mean_sums.contiguous();
  at::Tensor out = at::empty({C}, s.options());
  if (C == 0) return out;
  SYNCBN_LAUNCH(merge_grid(C), kMergeThreads, 0, c10::cuda::getCurrentCUDAStream(), deviation_sums_kernel)(
      s.const_data_ptr<double>(), m.const_data_ptr<double>(), C, out.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_reduced_stats(
    const at::Tensor& mean_sums, const at::Tensor& m2, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    double momentum, double eps, bool acc_double) {
  using namespace detail;
  constexpr const char* kOp = "batch_norm_reduced_stats";
  TORCH_CHECK(mean_sums.defined() && simt::is_device_tensor(mean_sums), kOp, ": mean_sums must be a CUDA tensor");
  const int64_t C = checks::reduced_m2(m2, mean_sums, kOp);
  checks::running_stats(running_mean, running_var, num_batches_tracked, momentum, C, mean_sums.device(), kOp);
  const c10::cuda::CUDAGuard guard(mean_sums.device());
  const at::Tensor sums = mean_sums.contiguous();
  const at::Tensor dev = m2.contiguous();
  return launch_merge(sums, C, running_mean, running_var, num_batches_tracked, momentum, acc_double,
                      [&](auto acc_tag, auto run_tag, const at::Tensor& mean, const at::Tensor& invstd,
                          const at::Tensor& count, const at::Tensor* rm, const at::Tensor* rv, const at::Tensor* nbt) {
    using acc_t = typename decltype(acc_tag)::type;
    using run_t = typename decltype(run_tag)::type;
    SYNCBN_LAUNCH(merge_grid(C), kMergeThreads, 0, c10::cuda::getCurrentCUDAStream(),
                  reduced_stats_kernel<acc_t, run_t>)(
        sums.const_data_ptr<double>(), dev.const_data_ptr<double>(), C, mean.data_ptr<acc_t>(),
        invstd.data_ptr<acc_t>(), count.data_ptr<double>(), data_or_null<run_t>(rm), data_or_null<run_t>(rv),
        nbt != nullptr ? nbt->const_data_ptr<int64_t>() : nullptr, momentum, eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void exchange_stats_occupancy(std::vector<KernelOccupancy>& out) {
  using namespace detail;
  add_occupancy(out, "mean_sums", mean_sums_kernel, kMergeThreads);
  add_occupancy(out, "deviation_sums", deviation_sums_kernel, kMergeThreads);
  add_occupancy(out, "reduced_stats<float,float>", reduced_stats_kernel<float, float>, kMergeThreads);
}

}  // namespace syncbn::cuda
