// batch_norm_gather_stats: merges the all_gathered rows [W, 2C+1] = [count, mean(C), m2(C)] of every rank
// with Chan's formula, on the device, and updates the running statistics in the same kernel.
//
// Unlike torch.batch_norm_gather_stats_with_counts as nn.SyncBatchNorm drives it, there is no boolean
// mask over the rows (a host sync) and no .item() for momentum=None: zero-count rows contribute nothing
// by construction, and the cumulative factor 1/num_batches_tracked is read on the device.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include "launch.cuh"
#include "../ops.h"

namespace syncbn::cuda {
namespace detail {
namespace {

// One thread per channel, all maths in float64 (W is small; this kernel is latency-bound). Rows of ranks
// with count 0 are skipped, so whatever they hold (even NaN) cannot leak into the merge.
template <typename acc_t, typename run_t>
__global__ void gather_stats_kernel(SYNCBN_PTR(const double) rows, int64_t W, int64_t C,
                                    SYNCBN_PTR(acc_t) mean_out, SYNCBN_PTR(acc_t) invstd_out,
                                    SYNCBN_PTR(double) count_out, SYNCBN_PTR(run_t) running_mean,
                                    SYNCBN_PTR(run_t) running_var, SYNCBN_PTR(const int64_t) num_batches,
                                    double momentum, double eps) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = 2 * C + 1;
  double n = 0.0;
  for (int64_t w = 0; w < W; ++w) n += rows[w * stride];
  if (c == 0) *count_out = n;
  if (c >= C) return;
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
    // was incremented before this call; a counter <= 0 would be a caller bug, clamp instead of 1/0).
    const double f =
        momentum >= 0.0 ? momentum : 1.0 / double(num_batches[0] > 0 ? num_batches[0] : int64_t(1));
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

void check_running(const at::Tensor& t, const at::Tensor& rows, int64_t C, const char* what) {
  TORCH_CHECK(t.device() == rows.device(), "batch_norm_gather_stats: ", what, " must be on ", rows.device(),
              ", got ", t.device());
  TORCH_CHECK(t.numel() == C && t.is_contiguous(), "batch_norm_gather_stats: ", what,
              " must be a contiguous tensor with one value per channel (", C, "), got shape ", t.sizes());
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), "batch_norm_gather_stats: ", what,
              " must be floating point, got ", t.scalar_type());
}

}  // namespace
}  // namespace detail

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_gather_stats(
    const at::Tensor& gathered, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    double momentum, double eps, bool acc_double) {
  using namespace detail;
  TORCH_CHECK(gathered.defined() && simt::is_device_tensor(gathered), "batch_norm_gather_stats: expected CUDA rows");
  TORCH_CHECK(gathered.dim() == 2 && gathered.size(1) % 2 == 1,
              "batch_norm_gather_stats: expected gathered stats of shape [world_size, 2*C+1], got ",
              gathered.sizes());
  const c10::cuda::CUDAGuard guard(gathered.device());
  const at::Tensor rows = gathered.to(at::kDouble).contiguous();
  const int64_t C = (rows.size(1) - 1) / 2;
  const auto acc = acc_double ? at::kDouble : at::kFloat;
  at::Tensor mean = at::empty({C}, rows.options().dtype(acc));
  at::Tensor invstd = at::empty({C}, rows.options().dtype(acc));
  at::Tensor count = at::empty({}, rows.options());

  const bool update = present(running_mean);
  TORCH_CHECK(update == present(running_var),
              "batch_norm_gather_stats: pass both running_mean and running_var, or neither");
  const at::Tensor* rm = nullptr;
  const at::Tensor* rv = nullptr;
  const at::Tensor* nbt = nullptr;
  if (update) {
    rm = &*running_mean;
    rv = &*running_var;
    check_running(*rm, rows, C, "running_mean");
    check_running(*rv, rows, C, "running_var");
    TORCH_CHECK(rm->scalar_type() == rv->scalar_type(),
                "batch_norm_gather_stats: running_mean and running_var must share a dtype, got ",
                rm->scalar_type(), " and ", rv->scalar_type());
    if (momentum < 0) {
      TORCH_CHECK(present(num_batches_tracked),
                  "batch_norm_gather_stats: momentum < 0 (momentum=None, cumulative average) needs "
                  "num_batches_tracked");
      nbt = &*num_batches_tracked;
      TORCH_CHECK(nbt->scalar_type() == at::kLong && nbt->numel() == 1 && nbt->device() == rows.device(),
                  "batch_norm_gather_stats: num_batches_tracked must be a one-element int64 tensor on ",
                  rows.device(), ", got ", nbt->scalar_type(), " ", nbt->sizes(), " on ", nbt->device());
    }
  }
  const auto run_type = update ? rm->scalar_type() : acc;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, run_type, "syncbn_batch_norm_gather_stats_cuda", [&] {
    if (acc_double)
      launch_gather<double, scalar_t>(rows, C, mean, invstd, count, rm, rv, nbt, momentum, eps);
    else
      launch_gather<float, scalar_t>(rows, C, mean, invstd, count, rm, rv, nbt, momentum, eps);
  });
  return {mean, invstd, count};
}

}  // namespace syncbn::cuda
