// batch_norm_gather_stats: merges the all_gathered rows [W, 2C+1] = [count, mean(C), m2(C)] of every rank
// with Chan's formula, on the device, and updates the running statistics in the same kernel.
//
// Unlike torch.batch_norm_gather_stats_with_counts as nn.SyncBatchNorm drives it, there is no boolean
// mask over the rows (a host sync) and no .item() for momentum=None: zero-count rows contribute nothing
// by construction, and the cumulative factor 1/num_batches_tracked is read on the device.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>

#include "launch.cuh"
#include "occupancy.cuh"
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
  const double not_a_number = ::nan("");
  if (c == 0) *count_out = valid ? n : not_a_number;
  if (c >= C) return;
  if (!valid) {
    mean_out[c] = acc_t(not_a_number);
    invstd_out[c] = acc_t(not_a_number);
    return;
  }
  if (!(n > 0.0)) {
    mean_out[c] = acc_t(0);
    invstd_out[c] = acc_t(0);
    return;
  }
  double weighted = 0.0;
  for (int64_t w = 0; w < W; ++w) {
    const double nw = rows[w * stride];
    if (nw > 0.0) weighted += nw * rows[w * stride + 1 + c];
  }
  const double mean = weighted / n;
  double m2 = 0.0;
  for (int64_t w = 0; w < W; ++w) {
    const double nw = rows[w * stride];
    if (nw > 0.0) {
      const double d = rows[w * stride + 1 + c] - mean;
      m2 += rows[w * stride + 1 + C + c] + nw * d * d;
    }
  }
  mean_out[c] = acc_t(mean);
  invstd_out[c] = acc_t(1.0 / sqrt(m2 / n + eps));
  if (running_mean != nullptr) {
    // momentum < 0 encodes momentum=None: cumulative average over the batches seen so far (the counter
    // was incremented before this call; a counter <= 0 is a caller bug: NaN, not a plausible factor).
    const double f = momentum >= 0.0 ? momentum : num_batches[0] > 0 ? 1.0 / double(num_batches[0]) : not_a_number;
    // Unbiased variance over the global count; n == 1 gives 0/0 = NaN exactly as the reference does.
    const double unbiased = m2 / (n - 1.0);
    running_mean[c] = run_t((1.0 - f) * double(running_mean[c]) + f * mean);
    running_var[c] = run_t((1.0 - f) * double(running_var[c]) + f * unbiased);
  }
}

template <typename acc_t, typename run_t>
void launch_gather(const at::Tensor& rows, int64_t C, const at::Tensor& mean, const at::Tensor& invstd,
                   const at::Tensor& count, const at::Tensor* running_mean, const at::Tensor* running_var,
                   const at::Tensor* num_batches, double momentum, double eps) {
  constexpr int kGatherThreads = 128;
  // At least one block even for C == 0: thread 0 still writes the global count.
  const dim3 grid(unsigned(std::max<int64_t>(ceil_div(C, kGatherThreads), 1)));
  SYNCBN_LAUNCH(grid, kGatherThreads, 0, c10::cuda::getCurrentCUDAStream(), gather_stats_kernel<acc_t, run_t>)(
      rows.const_data_ptr<double>(), rows.size(0), C, mean.data_ptr<acc_t>(), invstd.data_ptr<acc_t>(),
      count.data_ptr<double>(), running_mean ? running_mean->data_ptr<run_t>() : nullptr,
      running_var ? running_var->data_ptr<run_t>() : nullptr,
      num_batches ? num_batches->const_data_ptr<int64_t>() : nullptr, momentum, eps);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
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
  const auto acc = acc_double ? at::kDouble : at::kFloat;
  at::Tensor mean = at::empty({C}, rows.options().dtype(acc));
  at::Tensor invstd = at::empty({C}, rows.options().dtype(acc));
  at::Tensor count = at::empty({}, rows.options());
  const bool update = present(running_mean);
  const at::Tensor* rm = update ? &*running_mean : nullptr;
  const at::Tensor* rv = update ? &*running_var : nullptr;
  const at::Tensor* nbt = update && momentum < 0 ? &*num_batches_tracked : nullptr;
  const auto run_type = update ? rm->scalar_type() : acc;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, run_type, "syncbn_batch_norm_gather_stats_cuda", [&] {
    if (acc_double)
      launch_gather<double, scalar_t>(rows, C, mean, invstd, count, rm, rv, nbt, momentum, eps);
    else
      launch_gather<float, scalar_t>(rows, C, mean, invstd, count, rm, rv, nbt, momentum, eps);
  });
  return {mean, invstd, count};
}

void gather_stats_occupancy(std::vector<KernelOccupancy>& out) {
  using namespace detail;
  add_occupancy(out, "gather_stats<float,float>", gather_stats_kernel<float, float>, 128);
  add_occupancy(out, "gather_stats<double,double>", gather_stats_kernel<double, double>, 128);
}

}  // namespace syncbn::cuda
