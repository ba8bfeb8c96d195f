// batch_norm_backward_reduce: per-channel sum(dy) and sum(dy * xhat) in one read of x and dy,
// packed as [2*C] in the acc type. sum(dy * (x - mean)) is accumulated and scaled by invstd once.
// Tile sums live in acc-type vector lanes and are added to double totals once per tile.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/zeros.h>

#include "../ops.h"
#include "layout.h"
#include "vec_io.h"

namespace syncbn::cpu {
namespace {
using namespace detail;

constexpr int64_t kRowTileValues = 65536;  // rows per tile * C (tile sums stay in L1/L2)
constexpr int64_t kBlockRows = 8;          // rows whose sums a channel vector keeps in registers

struct DySums {
  double dy = 0.0;
  double dy_xmu = 0.0;
};

// Adds sum(dy) and sum(dy * (x - mean)) of channel c over planes n0..n1 (S values each, stride
// C*S) to `out`.
template <typename scalar_t>
inline void accumulate_planes(const scalar_t* x, const scalar_t* dy, int64_t C, int64_t S, int64_t c,
                              int64_t n0, int64_t n1, acc_type<scalar_t> mean, DySums& out) {
  using IO = VecIO<scalar_t>;
  using acc_t = typename IO::acc_t;
  using AVec = typename IO::AVec;
  const AVec vm(mean);
  AVec s0(0), s1(0), t0(0), t1(0), a, b, g, h;
  const int64_t vec_end = S - S % IO::kStep;
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t off = (n * C + c) * S;
    const scalar_t* xp = x + off;
    const scalar_t* gp = dy + off;
    for (int64_t i = 0; i < vec_end; i += IO::kStep) {
      IO::load(xp + i, a, b);
      IO::load(gp + i, g, h);
      s0 += g;
      s1 += h;
      t0 = at::vec::fmadd(g, a - vm, t0);
      t1 = at::vec::fmadd(h, b - vm, t1);
    }
    if (vec_end < S) {
      IO::load_tail(xp + vec_end, S - vec_end, mean, a, b);
      IO::load_tail(gp + vec_end, S - vec_end, acc_t(0), g, h);
      s0 += g;
      s1 += h;
      t0 = at::vec::fmadd(g, a - vm, t0);
      t1 = at::vec::fmadd(h, b - vm, t1);
    }
  }
  out.dy += static_cast<double>(hsum<acc_t>(s0 + s1));
  out.dy_xmu += static_cast<double>(hsum<acc_t>(t0 + t1));
}

template <typename scalar_t>
void reduce_planes(const scalar_t* x, const scalar_t* dy, const InputLayout& lay,
                   const std::vector<acc_type<scalar_t>>& mu, std::vector<DySums>& out) {
  const int64_t N = lay.n, C = lay.c, S = lay.s;
  // One plane at a time, walking memory forward (see stats.cpp for why planes are not grouped).
  const int64_t P = 1;
  if (C >= at::get_num_threads() || N == 1) {
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t n0 = 0; n0 < N; n0 += P)
        for (int64_t c = c0; c < c1; ++c)
          accumulate_planes(x, dy, C, S, c, n0, std::min(N, n0 + P), mu[c], out[c]);
    });
    return;
  }
  const int64_t chunks = num_chunks(N, 1);
  std::vector<std::vector<DySums>> part(chunks, std::vector<DySums>(C));
  at::parallel_for(0, chunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t nb = N * k / chunks, ne = N * (k + 1) / chunks;
      for (int64_t n0 = nb; n0 < ne; n0 += P)
        for (int64_t c = 0; c < C; ++c)
          accumulate_planes(x, dy, C, S, c, n0, std::min(ne, n0 + P), mu[c], part[k][c]);
    }
  });
  for (int64_t k = 0; k < chunks; ++k)
    for (int64_t c = 0; c < C; ++c) {
      out[c].dy += part[k][c].dy;
      out[c].dy_xmu += part[k][c].dy_xmu;
    }
}

template <typename scalar_t>
void reduce_rows(const scalar_t* x, const scalar_t* dy, int64_t M, int64_t C,
                 const std::vector<acc_type<scalar_t>>& mu, std::vector<DySums>& out) {
  using IO = VecIO<scalar_t>;
  using acc_t = typename IO::acc_t;
  using AVec = typename IO::AVec;
  constexpr int64_t W = IO::kWidth;
  const int64_t vec_c = C - C % IO::kStep;
  const int64_t R = std::clamp<int64_t>(kRowTileValues / std::max<int64_t>(C, 1), 32, 4096);
  const int64_t tiles = (M + R - 1) / R;
  const int64_t chunks = num_chunks(tiles, 1);
  std::vector<std::vector<DySums>> part(chunks, std::vector<DySums>(C));
  const acc_t* m = mu.data();
  at::parallel_for(0, chunks, 1, [&](int64_t k0, int64_t k1) {
    std::vector<acc_t> sdy(C), sdx(C);
    for (int64_t k = k0; k < k1; ++k)
      for (int64_t t = tiles * k / chunks; t < tiles * (k + 1) / chunks; ++t) {
        std::fill(sdy.begin(), sdy.end(), acc_t(0));
        std::fill(sdx.begin(), sdx.end(), acc_t(0));
        acc_t* s = sdy.data();
        acc_t* q = sdx.data();
        const int64_t r1 = std::min(M, (t + 1) * R);
        // Blocks of kBlockRows rows: each channel vector's sums stay in registers across a block, so the tile sums
        // in memory are read and written once per block rather than once per row.
        for (int64_t b0 = t * R; b0 < r1; b0 += kBlockRows) {
          const int64_t b1 = std::min(r1, b0 + kBlockRows);
          for (int64_t c = 0; c < vec_c; c += IO::kStep) {
            const AVec ma = AVec::loadu(m + c), mb = AVec::loadu(m + c + W);
            AVec sa(0), sb(0), qa(0), qb(0), a, b, g, h;
            for (int64_t r = b0; r < b1; ++r) {
              IO::load(x + r * C + c, a, b);
              IO::load(dy + r * C + c, g, h);
              sa += g;
              sb += h;
              qa = at::vec::fmadd(g, a - ma, qa);
              qb = at::vec::fmadd(h, b - mb, qb);
            }
            (AVec::loadu(s + c) + sa).store(s + c);
            (AVec::loadu(s + c + W) + sb).store(s + c + W);
            (AVec::loadu(q + c) + qa).store(q + c);
            (AVec::loadu(q + c + W) + qb).store(q + c + W);
          }
          for (int64_t r = b0; r < b1; ++r)
            for (int64_t c = vec_c; c < C; ++c) {
              const acc_t gv = static_cast<acc_t>(dy[r * C + c]);
              s[c] += gv;
              q[c] += gv * (static_cast<acc_t>(x[r * C + c]) - m[c]);
            }
        }
        for (int64_t c = 0; c < C; ++c) {
          part[k][c].dy += s[c];
          part[k][c].dy_xmu += q[c];
        }
      }
  });
  for (int64_t k = 0; k < chunks; ++k)
    for (int64_t c = 0; c < C; ++c) {
      out[c].dy += part[k][c].dy;
      out[c].dy_xmu += part[k][c].dy_xmu;
    }
}

// reduce_rows with G rows at a time (layout.h's row_group: full vector steps), then the M % G rows left.
template <typename scalar_t>
void reduce_grouped_rows(const scalar_t* x, const scalar_t* dy, int64_t M, int64_t C,
                         const std::vector<acc_type<scalar_t>>& mu, std::vector<DySums>& out) {
  const int64_t G = row_group(C, VecIO<scalar_t>::kStep), grouped = M / G * G;
  if (G == 1) {
    reduce_rows(x, dy, M, C, mu, out);
    return;
  }
  if (grouped > 0) {
    std::vector<DySums> wide(G * C);
    reduce_rows(x, dy, M / G, G * C, repeat_channels(mu, G), wide);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t c = 0; c < C; ++c) {
        out[c].dy += wide[g * C + c].dy;
        out[c].dy_xmu += wide[g * C + c].dy_xmu;
      }
  }
  if (grouped < M) reduce_rows(x + grouped * C, dy + grouped * C, M - grouped, C, mu, out);
}

}  // namespace

at::Tensor batch_norm_backward_reduce(const at::Tensor& grad_out, const at::Tensor& input,
                                      const at::Tensor& mean, const at::Tensor& invstd) {
  const char* op = "batch_norm_backward_reduce";
  const InputLayout lay = check_input(input, op);
  check_like_input(grad_out, input, lay, op, "grad_out");
  const int64_t C = lay.c;
  check_vector(mean, C, op, "mean", "one per channel");
  check_vector(invstd, C, op, "invstd", "one per channel");
  const std::vector<double> mu_d = to_double_vector(mean);
  const std::vector<double> inv = to_double_vector(invstd);
  std::vector<DySums> sums(C);
  const auto acc = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor out = at::zeros({2 * C}, input.options().dtype(acc));
  if (input.numel() > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "syncbn_bwd_reduce", [&] {
      using acc_t = acc_type<scalar_t>;
      const std::vector<acc_t> mu(mu_d.begin(), mu_d.end());
      const scalar_t* x = input.const_data_ptr<scalar_t>();
      const scalar_t* dy = grad_out.const_data_ptr<scalar_t>();
      if (lay.layout == Layout::kPlanes)
        reduce_planes(x, dy, lay, mu, sums);
      else
        reduce_grouped_rows(x, dy, lay.rows(), C, mu, sums);
      acc_t* o = out.data_ptr<acc_t>();
      for (int64_t c = 0; c < C; ++c) {
        o[c] = static_cast<acc_t>(sums[c].dy);
        o[C + c] = static_cast<acc_t>(sums[c].dy_xmu * inv[c]);
      }
    });
  }
  return out;
}

}  // namespace syncbn::cpu
