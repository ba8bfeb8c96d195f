// What batch_norm_gather_stats and batch_norm_reduced_stats share once a channel's merged count, mean and M2 are
// known: the outputs (mean, invstd in the accumulation type, the global count) and the running-statistics update,
// written on the device by one thread per channel, and the host side that allocates the outputs and picks the
// kernel instantiation (accumulation type x running-statistics dtype).
#pragma once
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>

#include <optional>
#include <tuple>

#include "launch.cuh"

namespace syncbn::cuda::detail {

constexpr int kMergeThreads = 128;

// Channel c's outputs from its merged statistics over n values. valid = false (a negative or NaN count: a caller
// bug the device cannot raise for without a host sync) gives NaN outputs and leaves the running stats alone;
// n == 0 gives mean = invstd = 0 and leaves them alone.
template <typename acc_t, typename run_t>
__device__ __forceinline__ void store_merged(int64_t c, bool valid, double n, double mean, double m2,
                                             SYNCBN_PTR(acc_t) mean_out, SYNCBN_PTR(acc_t) invstd_out,
                                             SYNCBN_PTR(run_t) running_mean, SYNCBN_PTR(run_t) running_var,
                                             SYNCBN_PTR(const int64_t) num_batches, double momentum, double eps) {
  const double not_a_number = ::nan("");
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

// At least one block even for C == 0: thread 0 still writes the global count.
inline dim3 merge_grid(int64_t C) { return dim3(unsigned(std::max<int64_t>(ceil_div(C, kMergeThreads), 1))); }

// Allocates (mean, invstd, count) for C channels next to `like` and calls
// launch(acc_t{}, run_t{}, mean, invstd, count, running_mean*, running_var*, num_batches_tracked*) with the
// instantiation types as TypeTags; the pointers are null where not given (or, for the counter, not needed).
template <typename Launch>
std::tuple<at::Tensor, at::Tensor, at::Tensor> launch_merge(const at::Tensor& like, int64_t C,
                                                            const std::optional<at::Tensor>& running_mean,
                                                            const std::optional<at::Tensor>& running_var,
                                                            const std::optional<at::Tensor>& num_batches_tracked,
                                                            double momentum, bool acc_double, Launch&& launch) {
  const auto acc = acc_double ? at::kDouble : at::kFloat;
  at::Tensor mean = at::empty({C}, like.options().dtype(acc));
  at::Tensor invstd = at::empty({C}, like.options().dtype(acc));
  at::Tensor count = at::empty({}, like.options().dtype(at::kDouble));
  const bool update = present(running_mean);
  const at::Tensor* rm = update ? &*running_mean : nullptr;
  const at::Tensor* rv = update ? &*running_var : nullptr;
  const at::Tensor* nbt = update && momentum < 0 ? &*num_batches_tracked : nullptr;
  const auto run_type = update ? rm->scalar_type() : acc;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, run_type, "syncbn_merge_cuda", [&] {
    if (acc_double)
      launch(TypeTag<double>{}, TypeTag<scalar_t>{}, mean, invstd, count, rm, rv, nbt);
    else
      launch(TypeTag<float>{}, TypeTag<scalar_t>{}, mean, invstd, count, rm, rv, nbt);
  });
  return {mean, invstd, count};
}

template <typename T>
inline T* data_or_null(const at::Tensor* t) {
  return t != nullptr ? t->data_ptr<T>() : nullptr;
}

}  // namespace syncbn::cuda::detail
