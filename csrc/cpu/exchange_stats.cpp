// The forward exchange's three C-sized ops (contract: csrc/ops.h): batch_norm_mean_sums (payload of the first
// all_reduce), batch_norm_deviation_sums (payload of the second) and batch_norm_reduced_stats (the merged
// statistics and the running-statistics update). Together they compute Chan's merge of the ranks'
// [n, mean, M2] rows, term for term as batch_norm_gather_stats does, with sums over the ranks instead of a
// loop over gathered rows. C values: scalar code.
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>

#include "../checks.h"
#include "../ops.h"
#include "merge.h"

namespace syncbn::cpu {

at::Tensor batch_norm_mean_sums(const at::Tensor& stats) {
  const char* op = "batch_norm_mean_sums";
  TORCH_CHECK(stats.defined() && stats.device().is_cpu(), op, ": stats must be a CPU tensor");
  const int64_t C = checks::packed_stats(stats, op);
  const at::Tensor s = stats.contiguous();
  at::Tensor out = at::empty({C + 1}, s.options());
  const double* p = s.const_data_ptr<double>();
  double* o = out.data_ptr<double>();
  const double n = p[0];
  o[0] = n;
  // An empty rank adds exact zeros, whatever its mean holds.
  for (int64_t c = 0; c < C; ++c) o[1 + c] = n > 0.0 ? detail::rounded_product(n, p[1 + c]) : 0.0;
  return out;
}

at::Tensor batch_norm_deviation_sums(const at::Tensor& stats, const at::Tensor& mean_sums) {
  const char* op = "batch_norm_deviation_sums";
  TORCH_CHECK(stats.defined() && stats.device().is_cpu(), op, ": stats must be a CPU tensor");
  const int64_t C = checks::packed_stats(stats, op);
  checks::mean_sums(mean_sums, C, stats.device(), op, "stats");
  const at::Tensor s = stats.contiguous();
  const at::Tensor m = mean_sums.contiguous();
  at::Tensor out = at::empty({C}, s.options());
  const double* p = s.const_data_ptr<double>();
  const double* q = m.const_data_ptr<double>();
  double* o = out.data_ptr<double>();
  const double n = p[0];
  const double total = q[0];
  for (int64_t c = 0; c < C; ++c) {
    // An empty rank (or group) adds exact zeros. M2_r + n_r (mean_r - mean)^2: both terms >= 0, so the sum
    // over the ranks cannot cancel.
    if (n > 0.0 && total > 0.0) {
      const double d = p[1 + c] - q[1 + c] / total;
      o[c] = p[1 + C + c] + n * d * d;
    } else {
      o[c] = 0.0;
    }
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_reduced_stats(
    const at::Tensor& mean_sums, const at::Tensor& m2, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    double momentum, double eps, bool acc_double) {
  const char* op = "batch_norm_reduced_stats";
  TORCH_CHECK(mean_sums.defined() && mean_sums.device().is_cpu(), op, ": mean_sums must be a CPU tensor");
  const int64_t C = checks::reduced_m2(m2, mean_sums, op);
  checks::running_stats(running_mean, running_var, num_batches_tracked, momentum, C, mean_sums.device(), op);
  const at::Tensor q = mean_sums.contiguous();
  const at::Tensor v = m2.contiguous();
  const double* qp = q.const_data_ptr<double>();
  const double n = qp[0];
  TORCH_CHECK(n >= 0.0, op, ": the reduced count is ", n, "; counts must be >= 0");
  const auto acc = acc_double ? at::kDouble : at::kFloat;
  at::Tensor count = at::scalar_tensor(n, q.options());
  if (n == 0.0) {  // empty everywhere: running stats untouched
    return {at::zeros({C}, q.options().dtype(acc)), at::zeros({C}, q.options().dtype(acc)), count};
  }
  at::Tensor mean_d = at::empty({C}, q.options());
  double* mu = mean_d.data_ptr<double>();
  for (int64_t c = 0; c < C; ++c) mu[c] = qp[1 + c] / n;
  auto [mean, invstd] = detail::finish_stats(mean_d, v, n, running_mean, running_var, num_batches_tracked, momentum,
                                             eps, acc, op);
  return {mean, invstd, count};
}

}  // namespace syncbn::cpu
