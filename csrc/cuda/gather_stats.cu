// batch_norm_gather_stats: merges the all_gathered rows [W, 2C+1] = [count, mean(C), m2(C)] of every rank
// with Chan's formula, on the device, and updates the running statistics in the same kernel.
//
// Unlike torch.batch_norm_gather_stats_with_counts as nn.SyncBatchNorm drives it, there is no boolean
// mask over the rows (a host sync) and no .item() for momentum=None: zero-count rows contribute nothing
// by construction, and the cumulative factor 1/num_batches_tracked is read on the device.
#include "merge.cuh"
#include "occupancy.cuh"
#include "reduce.cuh"
#include "../ops.h"

namespace syncbn::cuda {
namespace detail {
namespace {

// One thread per channel, all maths in float64 (W is small; this kernel is latency-bound). Rows of ranks
// with count 0 are skipped, so whatever they hold (even NaN) cannot leak into the merge. Invalid values,
// which the CPU op raises for but the device cannot report without a host sync, give NaN: a negative
// (or NaN) count makes every output NaN and leaves the running stats alone; num_batches_tracked <= 0
// makes the running stats NaN.
template <typename acc_t, typename run_t>
__global__ void gather_stats_kernel(SYNCBN_PTR(const double) rows, int64_t W, int64_t C,
                                    SYNCBN_PTR(acc_t) mean_out, SYNCBN_PTR(acc_t) invstd_out,
                                    SYNCBN_PTR(double) count_out, SYNCBN_PTR(run_t) running_mean,
                                    SYNCBN_PTR(run_t) running_var, SYNCBN_PTR(const int64_t) num_batches,
                                    double momentum, double eps) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = 2 * C + 1;
  double n = 0.0;
  bool valid = true;
  for (int64_t w = 0; w < W; ++w) {
    const double nw = rows[w * stride];
    valid = valid && nw >= 0.0;
    n += nw;
  }
  if (c == 0) *count_out = valid ? n : ::nan("");
  if (c >= C) return;
  double mean = 0.0, m2 = 0.0;
  if (valid && n > 0.0) {
    double weighted = 0.0;
    for (int64_t w = 0; w < W; ++w) {
      const double nw = rows[w * stride];
      // Each n * mean rounded on its own (no fma), as batch_norm_mean_sums rounds it before the all_reduce: the two
      // exchanges add the same terms, so rank means of +-3.4e38 give the same mean (0) through either.
      if (nw > 0.0) weighted += mul_rn(nw, rows[w * stride + 1 + c]);
    }
    mean = weighted / n;
    for (int64_t w = 0; w < W; ++w) {
      const double nw = rows[w * stride];
      if (nw > 0.0) {
        const double d = rows[w * stride + 1 + c] - mean;
        m2 += rows[w * stride + 1 + C + c] + nw * d * d;
      }
    }
  }
  store_merged<acc_t, run_t>(c, valid, n, mean, m2, mean_out, invstd_out, running_mean, running_var, num_batches,
                             momentum, eps);
}

}  // namespace
}  // namespace detail

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_gather_stats(
    const at::Tensor& gathered, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    double momentum, double eps, bool acc_double) {
  using namespace detail;
  constexpr const char* kOp = "batch_norm_gather_stats";
  TORCH_CHECK(gathered.defined() && simt::is_device_tensor(gathered), kOp, ": gathered must be a CUDA tensor");
  const int64_t C = checks::gathered_rows(gathered, kOp);
  checks::running_stats(running_mean, running_var, num_batches_tracked, momentum, C, gathered.device(), kOp);
  const c10::cuda::CUDAGuard guard(gathered.device());
  const at::Tensor rows = gathered.contiguous();
  return launch_merge(rows, C, running_mean, running_var, num_batches_tracked, momentum, acc_double,
                      [&](auto acc_tag, auto run_tag, const at::Tensor& mean, const at::Tensor& invstd,
                          const at::Tensor& count, const at::Tensor* rm, const at::Tensor* rv, const at::Tensor* nbt) {
    using acc_t = typename decltype(acc_tag)::type;
    using run_t = typename decltype(run_tag)::type;
    SYNCBN_LAUNCH(merge_grid(C), kMergeThreads, 0, c10::cuda::getCurrentCUDAStream(), gather_stats_kernel<acc_t, run_t>)(
        rows.const_data_ptr<double>(), rows.size(0), C, mean.data_ptr<acc_t>(), invstd.data_ptr<acc_t>(),
        count.data_ptr<double>(), data_or_null<run_t>(rm), data_or_null<run_t>(rv),
        nbt != nullptr ? nbt->const_data_ptr<int64_t>() : nullptr, momentum, eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void gather_stats_occupancy(std::vector<KernelOccupancy>& out) {
  using namespace detail;
  add_occupancy(out, "gather_stats<float,float>", gather_stats_kernel<float, float>, kMergeThreads);
  add_occupancy(out, "gather_stats<double,double>", gather_stats_kernel<double, double>, kMergeThreads);
}

}  // namespace syncbn::cuda
