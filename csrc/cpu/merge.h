// The tail shared by the two ops that end the forward's merge (batch_norm_gather_stats and
// batch_norm_reduced_stats): invstd from the merged M2 and the running-statistics update. Private to csrc/cpu/.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace syncbn::cpu::detail {

// a * b rounded to float64 on its own. batch_norm_mean_sums rounds each rank's n * mean before the all_reduce adds
// them, and batch_norm_gather_stats must add the very same terms: a compiler building with -mfma may otherwise
// fuse the product into the running sum (one rounding instead of two), which at rank means of +-3.4e38 left the
// gather's mean at 1.06e21 where the all_reduces give exactly 0. Storing through a volatile forbids the fusion.
inline double rounded_product(double a, double b) {
  volatile double p = a * b;
  return p;
}

// (mean, invstd) in `acc` from the merged float64 mean and M2 [C] over n > 0 values per channel; running_mean
// and running_var (if given) move towards mean and the unbiased M2 / (n - 1) by momentum, or by
// 1 / num_batches_tracked when momentum < 0.
std::tuple<at::Tensor, at::Tensor> finish_stats(const at::Tensor& mean, const at::Tensor& m2, double n,
                                                const std::optional<at::Tensor>& running_mean,
                                                const std::optional<at::Tensor>& running_var,
                                                const std::optional<at::Tensor>& num_batches_tracked,
                                                double momentum, double eps, at::ScalarType acc, const char* op);

}  // namespace syncbn::cpu::detail
