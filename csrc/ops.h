// The eight SyncBN kernel ops, declared once for the three places that define them: syncbn:: (the
// device dispatchers in csrc/bindings.cpp), syncbn::cpu (csrc/cpu/) and syncbn::cuda (csrc/cuda/).
//
// Only ATen's core Tensor header is included: <torch/extension.h> (pybind11 and the whole C++
// frontend) costs ~30 s of compile time per C++ kernel file and ~8x per nvcc file, so the kernels
// include this header and only csrc/bindings.cpp includes csrc/syncbn.h.
//
// Layouts: `input` is either contiguous (N, C, *) or channels_last / channels_last_3d contiguous; a
// 2-D (N, C) input is both. Output tensors keep the input's dtype and memory format.
// acc type: float64 for float64 input, float32 otherwise (float32, float16, bfloat16).
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

// Semantics of each op (the same in every namespace):
// batch_norm_stats: local per-channel statistics in one read of x (Welford/Chan), packed for a single all_gather:
// float64 tensor of shape [2*C + 1] = [count, mean_0..mean_{C-1}, m2_0..m2_{C-1}] on input's device.
// count = numel / C on this rank (0 for an empty batch: then mean = m2 = 0).
// batch_norm_gather_stats: merge gathered rows (float64 [W, 2*C+1], zero-count rows allowed) with Chan's formula, on the
// device, without host synchronisation. Returns (mean[C], invstd[C]) in `acc_double ? f64 : f32`
// and count (0-d float64 tensor, the global element count per channel).
// If running_mean/running_var are given and count > 0 they are updated in place:
//   r = (1 - f) * r + f * stat, with var unbiased (m2 / (count - 1)),
//   f = momentum if momentum >= 0, else 1 / num_batches_tracked (cumulative average; the 0-d int64
//   tensor num_batches_tracked is read on the device and has already been incremented).
// If count == 0: mean = 0, invstd = 0, running stats untouched.
// The forward's exchange without gathering rows: two all_reduces (2*C+1 values in all, whatever the world size)
// whose sums are Chan's merge of the ranks' rows, term for term as batch_norm_gather_stats computes it:
// batch_norm_mean_sums: the first all_reduce's payload, float64 [C+1] = [n, n*mean_0..C-1] from batch_norm_stats'
// [n, mean, M2]; an empty rank gives exact zeros.
// batch_norm_deviation_sums: the second's, float64 [C] = M2_c + n*(mean_c - S_c/N)^2, with [N, S] the
// all-reduced mean_sums (S/N the global mean); non-negative terms, so their sum cannot cancel. Zeros on an empty
// rank or group.
// batch_norm_reduced_stats: (mean, invstd, count) and the running-statistics update, exactly as
// batch_norm_gather_stats gives them for the one merged row [N, S/N, m2], m2 the all-reduced deviation sums.
// batch_norm_elemt: y = (x - mean) * invstd * weight + bias; weight/bias optional (affine=False) and may have a dtype
// other than input (e.g. fp32 parameters with bf16 activations). One read of x, one write of y.
// batch_norm_backward_reduce: local reductions for the backward in one read of x and dy (dy has input's layout), packed for a
// single all_reduce: acc-type tensor [2*C] = [sum_dy_0..C-1, sum_dy_xhat_0..C-1], xhat = (x-mean)*invstd.
// batch_norm_backward_elemt: dx = weight * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count), with `reduced` the
// all-reduced packed [2*C] tensor and count the 0-d float64 global count. weight optional (= 1).
// One read of x and dy, one write of dx (input's dtype and memory format).
#define SYNCBN_DECLARE_OPS                                                                               \
  at::Tensor batch_norm_stats(const at::Tensor& input);                                                  \
  std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_gather_stats(                                \
      const at::Tensor& gathered, const std::optional<at::Tensor>& running_mean,                         \
      const std::optional<at::Tensor>& running_var,                                                      \
      const std::optional<at::Tensor>& num_batches_tracked, double momentum, double eps,                 \
      bool acc_double);                                                                                  \
  at::Tensor batch_norm_mean_sums(const at::Tensor& stats);                                              \
  at::Tensor batch_norm_deviation_sums(const at::Tensor& stats, const at::Tensor& mean_sums);            \
  std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_reduced_stats(                               \
      const at::Tensor& mean_sums, const at::Tensor& m2, const std::optional<at::Tensor>& running_mean,  \
      const std::optional<at::Tensor>& running_var,                                                      \
      const std::optional<at::Tensor>& num_batches_tracked, double momentum, double eps,                 \
      bool acc_double);                                                                                  \
  at::Tensor batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,          \
                              const std::optional<at::Tensor>& bias, const at::Tensor& mean,             \
                              const at::Tensor& invstd);                                                 \
  at::Tensor batch_norm_backward_reduce(const at::Tensor& grad_out, const at::Tensor& input,             \
                                        const at::Tensor& mean, const at::Tensor& invstd);               \
  at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input,              \
                                       const at::Tensor& mean, const at::Tensor& invstd,                 \
                                       const std::optional<at::Tensor>& weight,                          \
                                       const at::Tensor& reduced, const at::Tensor& count);

namespace syncbn {
SYNCBN_DECLARE_OPS
namespace cpu {
SYNCBN_DECLARE_OPS
}  // namespace cpu
namespace cuda {
SYNCBN_DECLARE_OPS
}  // namespace cuda
}  // namespace syncbn
