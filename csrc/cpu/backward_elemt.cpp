// batch_norm_backward_elemt: dx = weight*invstd * (dy - sum_dy/n - xhat * sum_dy_xhat/n), one read
// of x and dy and one write of dx, rewritten per channel as dx = dy*g + (x - mean)*q + p with
//   g = weight*invstd, q = -g*invstd*sum_dy_xhat/n, p = -g*sum_dy/n  (computed in double).
#include <ATen/Dispatch.h>
#include <ATen/ops/zeros_like.h>

#include "../checks.h"
#include "../ops.h"
#include "elementwise.h"
#include "vec_io.h"

namespace syncbn::cpu {
namespace {
using namespace detail;

// backward_elemt_rows for rows of exactly kSteps vector steps: the per-channel values stay in registers for every
// row (short rows, such as the grouped rows of a few channels, spent most of their loads on them).
template <int kSteps, typename scalar_t>
void backward_elemt_short_rows(const scalar_t* x, const scalar_t* dy, scalar_t* dx, int64_t rows,
                               const acc_type<scalar_t>* mu, const acc_type<scalar_t>* gv,
                               const acc_type<scalar_t>* qv, const acc_type<scalar_t>* pv) {
  using IO = VecIO<scalar_t>;
  using AVec = typename IO::AVec;
  constexpr int64_t W = IO::kWidth, C = kSteps * IO::kStep;
  for_each_row_range(rows, C, [&](int64_t r0, int64_t r1) {
    AVec m[2 * kSteps], g[2 * kSteps], q[2 * kSteps], o[2 * kSteps];
    for (int i = 0; i < 2 * kSteps; ++i) {
      m[i] = AVec::loadu(mu + i * W);
      g[i] = AVec::loadu(gv + i * W);
      q[i] = AVec::loadu(qv + i * W);
      o[i] = AVec::loadu(pv + i * W);
    }
    for (int64_t r = r0; r < r1; ++r) {
      for (int i = 0; i < kSteps; ++i) {
        const int64_t off = r * C + i * IO::kStep;
        AVec a, b, da, db;
        IO::load(x + off, a, b);
        IO::load(dy + off, da, db);
        IO::store(dx + off, at::vec::fmadd(da, g[2 * i], at::vec::fmadd(a - m[2 * i], q[2 * i], o[2 * i])),
                  at::vec::fmadd(db, g[2 * i + 1], at::vec::fmadd(b - m[2 * i + 1], q[2 * i + 1], o[2 * i + 1])));
      }
    }
  });
}

// dx = dy * gv + (x - mu) * qv + pv over `rows` rows of C channels (per-channel values in acc_t).
template <typename scalar_t>
void backward_elemt_rows(const scalar_t* x, const scalar_t* dy, scalar_t* dx, int64_t rows, int64_t C,
                         const acc_type<scalar_t>* mu, const acc_type<scalar_t>* gv, const acc_type<scalar_t>* qv,
                         const acc_type<scalar_t>* pv) {
  using IO = VecIO<scalar_t>;
  using acc_t = typename IO::acc_t;
  using AVec = typename IO::AVec;
  constexpr int64_t W = IO::kWidth;
  switch (C % IO::kStep == 0 ? C / IO::kStep : 0) {
    case 1: return backward_elemt_short_rows<1>(x, dy, dx, rows, mu, gv, qv, pv);
    case 2: return backward_elemt_short_rows<2>(x, dy, dx, rows, mu, gv, qv, pv);
    case 3: return backward_elemt_short_rows<3>(x, dy, dx, rows, mu, gv, qv, pv);
    case 4: return backward_elemt_short_rows<4>(x, dy, dx, rows, mu, gv, qv, pv);
    default: break;
  }
  const int64_t vec_c = C - C % IO::kStep;
  for_each_row_range(rows, C, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const scalar_t* xr = x + r * C;
      const scalar_t* gr = dy + r * C;
      scalar_t* dr = dx + r * C;
      AVec a, b, g, h;
      for (int64_t c = 0; c < vec_c; c += IO::kStep) {
        IO::load(xr + c, a, b);
        IO::load(gr + c, g, h);
        a = at::vec::fmadd(g, AVec::loadu(gv + c), at::vec::fmadd(a - AVec::loadu(mu + c), AVec::loadu(qv + c),
                                                                  AVec::loadu(pv + c)));
        b = at::vec::fmadd(h, AVec::loadu(gv + c + W),
                           at::vec::fmadd(b - AVec::loadu(mu + c + W), AVec::loadu(qv + c + W),
                                          AVec::loadu(pv + c + W)));
        IO::store(dr + c, a, b);
      }
      for (int64_t c = vec_c; c < C; ++c)
        dr[c] = static_cast<scalar_t>(static_cast<acc_t>(gr[c]) * gv[c] +
                                      (static_cast<acc_t>(xr[c]) - mu[c]) * qv[c] + pv[c]);
    }
  });
}

template <typename scalar_t>
void backward_elemt_kernel(const at::Tensor& grad_out, const at::Tensor& input, at::Tensor& grad_in,
                           const InputLayout& lay, const std::vector<double>& mean,
                           const std::vector<double>& gain, const std::vector<double>& slope,
                           const std::vector<double>& offset) {
  using IO = VecIO<scalar_t>;
  using acc_t = typename IO::acc_t;
  using AVec = typename IO::AVec;
  const int64_t C = lay.c;
  std::vector<acc_t> mu(mean.begin(), mean.end()), gv(gain.begin(), gain.end()),
      qv(slope.begin(), slope.end()), pv(offset.begin(), offset.end());
  const scalar_t* x = input.const_data_ptr<scalar_t>();
  const scalar_t* dy = grad_out.const_data_ptr<scalar_t>();
  scalar_t* dx = grad_in.data_ptr<scalar_t>();

  if (lay.layout == Layout::kPlanes) {
    for_each_plane_segment(lay, [&](int64_t off, int64_t len, int64_t c) {
      const AVec vm(mu[c]), vg(gv[c]), vq(qv[c]), vp(pv[c]);
      const int64_t vec_end = len - len % IO::kStep;
      AVec a, b, g, h;
      for (int64_t i = off; i < off + vec_end; i += IO::kStep) {
        IO::load(x + i, a, b);
        IO::load(dy + i, g, h);
        IO::store(dx + i, at::vec::fmadd(g, vg, at::vec::fmadd(a - vm, vq, vp)),
                  at::vec::fmadd(h, vg, at::vec::fmadd(b - vm, vq, vp)));
      }
      if (vec_end < len) {
        const int64_t i = off + vec_end, rest = len - vec_end;
        IO::load_tail(x + i, rest, acc_t(0), a, b);
        IO::load_tail(dy + i, rest, acc_t(0), g, h);
        IO::store_tail(dx + i, rest, at::vec::fmadd(g, vg, at::vec::fmadd(a - vm, vq, vp)),
                       at::vec::fmadd(h, vg, at::vec::fmadd(b - vm, vq, vp)));
      }
    });
    return;
  }
  // Rows grouped G at a time (layout.h's row_group: full vector steps), then the M % G rows left.
  const int64_t M = lay.rows(), G = row_group(C, IO::kStep), grouped = M / G * G;
  if (G == 1) {
    backward_elemt_rows(x, dy, dx, M, C, mu.data(), gv.data(), qv.data(), pv.data());
    return;
  }
  const std::vector<acc_t> gmu = repeat_channels(mu, G), ggv = repeat_channels(gv, G),
                           gqv = repeat_channels(qv, G), gpv = repeat_channels(pv, G);
  if (grouped > 0) backward_elemt_rows(x, dy, dx, M / G, G * C, gmu.data(), ggv.data(), gqv.data(), gpv.data());
  if (grouped < M)
    backward_elemt_rows(x + grouped * C, dy + grouped * C, dx + grouped * C, M - grouped, C, mu.data(), gv.data(),
                        qv.data(), pv.data());
}

}  // namespace

at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input,
                                     const at::Tensor& mean, const at::Tensor& invstd,
                                     const std::optional<at::Tensor>& weight,
                                     const at::Tensor& reduced, const at::Tensor& count) {
  const char* op = "batch_norm_backward_elemt";
  const InputLayout lay = check_input(input, op);
  check_like_input(grad_out, input, lay, op, "grad_out");
  const int64_t C = lay.c;
  check_vector(mean, C, op, "mean", "one per channel");
  check_vector(invstd, C, op, "invstd", "one per channel");
  check_vector(reduced, 2 * C, op, "reduced", "[sum_dy, sum_dy_xhat] per channel");
  const bool has_w = weight.has_value() && weight->defined();
  if (has_w) check_vector(*weight, C, op, "weight", "one per channel");
  checks::count(count, input.device(), op);
  const double n = to_double(count);
  if (n <= 0.0 || input.numel() == 0) return at::zeros_like(input, at::MemoryFormat::Preserve);

  at::Tensor grad_in = empty_like_input(input, lay);
  const std::vector<double> mu = to_double_vector(mean);
  const std::vector<double> inv = to_double_vector(invstd);
  const std::vector<double> red = to_double_vector(reduced);
  std::vector<double> w = has_w ? to_double_vector(*weight) : std::vector<double>(C, 1.0);
  std::vector<double> gain(C), slope(C), offset(C);
  for (int64_t c = 0; c < C; ++c) {
    gain[c] = w[c] * inv[c];
    slope[c] = -gain[c] * inv[c] * red[C + c] / n;
    offset[c] = -gain[c] * red[c] / n;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "syncbn_bwd_elemt", [&] {
    backward_elemt_kernel<scalar_t>(grad_out, input, grad_in, lay, mu, gain, slope, offset);
  });
  return grad_in;
}

}  // namespace syncbn::cpu
