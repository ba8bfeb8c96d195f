// batch_norm_gather_stats: Chan merge of the gathered per-rank [count, mean, M2] rows and the
// running-statistics update. Works on C values, so it is plain scalar code.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>

#include <cmath>

#include "../checks.h"
#include "../ops.h"
#include "merge.h"

namespace syncbn::cpu {

namespace detail {

std::tuple<at::Tensor, at::Tensor> finish_stats(const at::Tensor& mean, const at::Tensor& m2, double n,
                                                const std::optional<at::Tensor>& running_mean,
                                                const std::optional<at::Tensor>& running_var,
                                                const std::optional<at::Tensor>& num_batches_tracked,
                                                double momentum, double eps, at::ScalarType acc, const char* op) {
  // Plain loops over the C values rather than tensor ops: a dozen small ATen calls here cost more than the kernels
  // of a small layer.
  const bool has_rm = running_mean.has_value() && running_mean->defined();
  double f = momentum;
  if (has_rm && momentum < 0) {
    const int64_t k = *num_batches_tracked->const_data_ptr<int64_t>();
    TORCH_CHECK(k > 0, op, ": num_batches_tracked must be >= 1 (already incremented), got ", k);
    f = 1.0 / static_cast<double>(k);
  }
  const int64_t C = mean.numel();
  const double* mu = mean.const_data_ptr<double>();
  const double* q = m2.const_data_ptr<double>();
  at::Tensor mean_out = at::empty({C}, mean.options().dtype(acc));
  at::Tensor invstd = at::empty({C}, mean.options().dtype(acc));
  AT_DISPATCH_FLOATING_TYPES(acc, "syncbn_finish_stats", [&] {
    scalar_t* mo = mean_out.data_ptr<scalar_t>();
    scalar_t* io = invstd.data_ptr<scalar_t>();
    for (int64_t c = 0; c < C; ++c) {
      mo[c] = static_cast<scalar_t>(mu[c]);
      io[c] = static_cast<scalar_t>(1.0 / std::sqrt(q[c] / n + eps));
    }
  });
  if (has_rm) {
    // In float64, rounded once to the buffers' dtype; the unbiased variance over n - 1 (n == 1 gives 0/0 = NaN, as
    // the reference does).
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, running_mean->scalar_type(), "syncbn_running_stats",
                                    [&] {
      scalar_t* rm = running_mean->data_ptr<scalar_t>();
      scalar_t* rv = running_var->data_ptr<scalar_t>();
      for (int64_t c = 0; c < C; ++c) {
        rm[c] = static_cast<scalar_t>((1.0 - f) * static_cast<double>(rm[c]) + f * mu[c]);
        rv[c] = static_cast<scalar_t>((1.0 - f) * static_cast<double>(rv[c]) + f * (q[c] / (n - 1.0)));
      }
    });
  }
  return {mean_out, invstd};
}

}  // namespace detail

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_gather_stats(
    const at::Tensor& gathered, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    double momentum, double eps, bool acc_double) {
  const char* op = "batch_norm_gather_stats";
  TORCH_CHECK(gathered.defined() && gathered.device().is_cpu(), op,
              ": gathered must be a CPU tensor");
  const int64_t C = checks::gathered_rows(gathered, op);
  checks::running_stats(running_mean, running_var, num_batches_tracked, momentum, C, gathered.device(), op);
  const int64_t W = gathered.size(0);
  const at::Tensor g = gathered.contiguous();
  const double* p = g.const_data_ptr<double>();
  const int64_t cols = 2 * C + 1;

  double n = 0.0;
  for (int64_t r = 0; r < W; ++r) {
    TORCH_CHECK(p[r * cols] >= 0.0, op, ": row ", r, " has count ", p[r * cols], "; counts must be >= 0");
    n += p[r * cols];
  }
  const auto acc = acc_double ? at::kDouble : at::kFloat;
  at::Tensor count = at::scalar_tensor(n, g.options());
  if (n == 0.0) {  // empty everywhere: running stats untouched
    return {at::zeros({C}, g.options().dtype(acc)), at::zeros({C}, g.options().dtype(acc)), count};
  }

  at::Tensor mean_d = at::empty({C}, g.options());
  at::Tensor m2_d = at::empty({C}, g.options());
  double* mu = mean_d.data_ptr<double>();
  double* m2 = m2_d.data_ptr<double>();
  for (int64_t c = 0; c < C; ++c) {
    double s = 0.0;
    for (int64_t r = 0; r < W; ++r) s += detail::rounded_product(p[r * cols], p[r * cols + 1 + c]);
    const double mc = s / n;
    double q = 0.0;
    for (int64_t r = 0; r < W; ++r) {
      const double nr = p[r * cols];
      const double dm = p[r * cols + 1 + c] - mc;
      q += p[r * cols + 1 + C + c] + nr * dm * dm;  // zero-count rows add exactly 0
    }
    mu[c] = mc;
    m2[c] = q;
  }
  auto [mean, invstd] = detail::finish_stats(mean_d, m2_d, n, running_mean, running_var, num_batches_tracked,
                                             momentum, eps, acc, op);
  return {mean, invstd, count};
}

}  // namespace syncbn::cpu
