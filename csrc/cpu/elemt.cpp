// batch_norm_elemt: y = (x - mean) * (invstd * weight) + bias, one read of x and one write of y.
// (x - mean) is formed before scaling (not x*scale + shift) so inputs with |mean| >> std keep
// their precision; the extra subtraction is free in a memory-bound loop.
#include <ATen/Dispatch.h>

#include "../ops.h"
#include "elementwise.h"
#include "vec_io.h"

namespace syncbn::cpu {
namespace {
using namespace detail;

// elemt_rows for rows of exactly kSteps vector steps: the per-channel values stay in registers for every row (short
// rows, such as the grouped rows of a few channels, spent most of their loads on them).
template <int kSteps, typename scalar_t>
void elemt_short_rows(const scalar_t* x, scalar_t* y, int64_t rows, const acc_type<scalar_t>* mu,
                      const acc_type<scalar_t>* sc, const acc_type<scalar_t>* sh) {
  using IO = VecIO<scalar_t>;
  using AVec = typename IO::AVec;
  constexpr int64_t W = IO::kWidth, C = kSteps * IO::kStep;
  for_each_row_range(rows, C, [&](int64_t r0, int64_t r1) {
    AVec m[2 * kSteps], s[2 * kSteps], h[2 * kSteps];
    for (int i = 0; i < 2 * kSteps; ++i) {
      m[i] = AVec::loadu(mu + i * W);
      s[i] = AVec::loadu(sc + i * W);
      h[i] = AVec::loadu(sh + i * W);
    }
    for (int64_t r = r0; r < r1; ++r) {
      for (int i = 0; i < kSteps; ++i) {
        AVec a, b;
        IO::load(x + r * C + i * IO::kStep, a, b);
        IO::store(y + r * C + i * IO::kStep, at::vec::fmadd(a - m[2 * i], s[2 * i], h[2 * i]),
                  at::vec::fmadd(b - m[2 * i + 1], s[2 * i + 1], h[2 * i + 1]));
      }
    }
  });
}

// y = (x - mu) * sc + sh over `rows` rows of C channels (per-channel values in acc_t).
template <typename scalar_t>
void elemt_rows(const scalar_t* x, scalar_t* y, int64_t rows, int64_t C, const acc_type<scalar_t>* mu,
                const acc_type<scalar_t>* sc, const acc_type<scalar_t>* sh) {
  using IO = VecIO<scalar_t>;
  using acc_t = typename IO::acc_t;
  using AVec = typename IO::AVec;
  constexpr int64_t W = IO::kWidth;
  switch (C % IO::kStep == 0 ? C / IO::kStep : 0) {
    case 1: return elemt_short_rows<1>(x, y, rows, mu, sc, sh);
    case 2: return elemt_short_rows<2>(x, y, rows, mu, sc, sh);
    case 3: return elemt_short_rows<3>(x, y, rows, mu, sc, sh);
    case 4: return elemt_short_rows<4>(x, y, rows, mu, sc, sh);
    default: break;
  }
  const int64_t vec_c = C - C % IO::kStep;
  for_each_row_range(rows, C, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const scalar_t* xr = x + r * C;
      scalar_t* yr = y + r * C;
      AVec a, b;
      for (int64_t c = 0; c < vec_c; c += IO::kStep) {
        IO::load(xr + c, a, b);
        a = at::vec::fmadd(a - AVec::loadu(mu + c), AVec::loadu(sc + c), AVec::loadu(sh + c));
        b = at::vec::fmadd(b - AVec::loadu(mu + c + W), AVec::loadu(sc + c + W), AVec::loadu(sh + c + W));
        IO::store(yr + c, a, b);
      }
      for (int64_t c = vec_c; c < C; ++c)
        yr[c] = static_cast<scalar_t>((static_cast<acc_t>(xr[c]) - mu[c]) * sc[c] + sh[c]);
    }
  });
}

template <typename scalar_t>
void elemt_kernel(const at::Tensor& input, at::Tensor& output, const InputLayout& lay,
                  const std::vector<double>& mean, const std::vector<double>& scale,
                  const std::vector<double>& shift) {
  using IO = VecIO<scalar_t>;
  using acc_t = typename IO::acc_t;
  using AVec = typename IO::AVec;
  const int64_t C = lay.c;
  std::vector<acc_t> mu(mean.begin(), mean.end()), sc(scale.begin(), scale.end()),
      sh(shift.begin(), shift.end());
  const scalar_t* x = input.const_data_ptr<scalar_t>();
  scalar_t* y = output.data_ptr<scalar_t>();

  if (lay.layout == Layout::kPlanes) {
    for_each_plane_segment(lay, [&](int64_t off, int64_t len, int64_t c) {
      const AVec vm(mu[c]), vs(sc[c]), vh(sh[c]);
      const scalar_t* xp = x + off;
      scalar_t* yp = y + off;
      const int64_t vec_end = len - len % IO::kStep;
      AVec a, b;
      for (int64_t i = 0; i < vec_end; i += IO::kStep) {
        IO::load(xp + i, a, b);
        IO::store(yp + i, at::vec::fmadd(a - vm, vs, vh), at::vec::fmadd(b - vm, vs, vh));
      }
      if (vec_end < len) {
        IO::load_tail(xp + vec_end, len - vec_end, acc_t(0), a, b);
        IO::store_tail(yp + vec_end, len - vec_end, at::vec::fmadd(a - vm, vs, vh),
                       at::vec::fmadd(b - vm, vs, vh));
      }
    });
    return;
  }
  // Rows grouped G at a time (layout.h's row_group: full vector steps), then the M % G rows left.
  const int64_t M = lay.rows(), G = row_group(C, IO::kStep), grouped = M / G * G;
  if (G == 1) {
    elemt_rows(x, y, M, C, mu.data(), sc.data(), sh.data());
    return;
  }
  const std::vector<acc_t> gmu = repeat_channels(mu, G), gsc = repeat_channels(sc, G), gsh = repeat_channels(sh, G);
  if (grouped > 0) elemt_rows(x, y, M / G, G * C, gmu.data(), gsc.data(), gsh.data());
  if (grouped < M) elemt_rows(x + grouped * C, y + grouped * C, M - grouped, C, mu.data(), sc.data(), sh.data());
}

}  // namespace

at::Tensor batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                            const at::Tensor& invstd) {
  const char* op = "batch_norm_elemt";
  const InputLayout lay = check_input(input, op);
  const int64_t C = lay.c;
  check_vector(mean, C, op, "mean", "one per channel");
  check_vector(invstd, C, op, "invstd", "one per channel");
  const bool has_w = weight.has_value() && weight->defined();
  const bool has_b = bias.has_value() && bias->defined();
  if (has_w) check_vector(*weight, C, op, "weight", "one per channel");
  if (has_b) check_vector(*bias, C, op, "bias", "one per channel");
  at::Tensor output = empty_like_input(input, lay);
  if (input.numel() == 0) return output;

  const std::vector<double> mu = to_double_vector(mean);
  std::vector<double> scale = to_double_vector(invstd);
  std::vector<double> shift(C, 0.0);
  if (has_w) {
    const std::vector<double> w = to_double_vector(*weight);
    for (int64_t c = 0; c < C; ++c) scale[c] *= w[c];
  }
  if (has_b) shift = to_double_vector(*bias);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "syncbn_elemt", [&] {
    elemt_kernel<scalar_t>(input, output, lay, mu, scale, shift);
  });
  return output;
}

}  // namespace syncbn::cpu
