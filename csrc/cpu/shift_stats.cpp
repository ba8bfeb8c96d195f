// batch_norm_shift_stats / batch_norm_unshift_stats (contract: csrc/ops.h): the forward's statistics as sums
// shifted by a value K every rank of the group shares, so that one all_reduce carries them for any world size.
// Plain sums of x and x^2 would cancel catastrophically when |mean| >> std; shifted by K near the mean they do not
// (Chan, Golub & LeVeque's shifted data), and unshift_stats reports per channel when they would. C values: scalar code.
#include <ATen/ops/empty.h>

#include <cmath>

#include "../checks.h"
#include "../ops.h"

namespace syncbn::cpu {

at::Tensor batch_norm_shift_stats(const at::Tensor& stats, const at::Tensor& shift) {
  const char* op = "batch_norm_shift_stats";
  TORCH_CHECK(stats.defined() && stats.device().is_cpu(), op, ": stats must be a CPU tensor");
  const int64_t C = checks::shifted_sums(stats, shift, op, "stats");
  const at::Tensor s = stats.contiguous();
  const at::Tensor k = shift.contiguous();
  at::Tensor out = at::empty({2 * C + 1}, s.options());
  const double* p = s.const_data_ptr<double>();
  const double* kp = k.const_data_ptr<double>();
  double* o = out.data_ptr<double>();
  const double n = p[0];
  o[0] = n;
  for (int64_t c = 0; c < C; ++c) {
    // An empty rank adds exact zeros, even where K is not finite.
    const double d = n > 0.0 ? p[1 + c] - kp[c] : 0.0;
    o[1 + c] = n > 0.0 ? n * d : 0.0;
    o[1 + C + c] = n > 0.0 ? p[1 + C + c] + n * d * d : 0.0;
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor> batch_norm_unshift_stats(const at::Tensor& sums, const at::Tensor& shift,
                                                            double max_ratio) {
  const char* op = "batch_norm_unshift_stats";
  TORCH_CHECK(sums.defined() && sums.device().is_cpu(), op, ": sums must be a CPU tensor");
  const int64_t C = checks::shifted_sums(sums, shift, op, "sums");
  const at::Tensor s = sums.contiguous();
  const at::Tensor k = shift.contiguous();
  at::Tensor row = at::empty({2 * C + 1}, s.options());
  at::Tensor exact = at::empty({C}, s.options().dtype(at::kBool));
  const double* p = s.const_data_ptr<double>();
  const double* kp = k.const_data_ptr<double>();
  double* r = row.data_ptr<double>();
  bool* e = exact.data_ptr<bool>();
  const double n = p[0];
  r[0] = n;
  for (int64_t c = 0; c < C; ++c) {
    if (!(n > 0.0)) {  // empty group: zeros (exact); a negative or NaN count: the gather decides
      r[1 + c] = 0.0;
      r[1 + C + c] = 0.0;
      e[c] = n == 0.0;
      continue;
    }
    const double s1 = p[1 + c];
    const double s2 = p[1 + C + c];
    const double q = s1 / n;
    const double m2 = s2 - s1 * q;
    const double mean = kp[c] + q;
    r[1 + c] = mean;
    r[1 + C + c] = m2 > 0.0 ? m2 : 0.0;
    e[c] = std::isfinite(s2) && std::isfinite(mean) && s2 <= max_ratio * m2;
  }
  return {row, exact};
}

}  // namespace syncbn::cpu
