// Per-channel count, mean and M2 for batch_norm_stats (csrc/cpu/stats.cpp): the two passes over a tile, the check
// that decides whether a tile's float32 passes are exact enough, and the float64 passes that take the tiles they
// are not. Private to csrc/cpu/.
//
// A channel's moments are kept relative to its shift K, the channel's first value (x[0, c, 0, ...]): tile means,
// Chan's merges and the threads' partials all work on x - K. So at |mean| >> std the merges add numbers of the
// order of the std, not of the mean (a running mean of 1e8 loses 1e-8 std per merge: float64 input at
// |mean| / std = 1e8 lost 1e-8 of its variance that way), and a constant channel has x - K = 0 exactly, so its
// M2 is exactly 0 at any magnitude.
//
// Range. A tile's float32 passes are exact enough where nothing overflowed and its squares are not subnormal:
// pass 2's sums of d = x - centre and of d^2, sd and sq, are finite (a square, a run of squares, x - K or pass 1's sum
// that overflowed gives inf or NaN) and sq is at least 2^-80, or the tile is constant (sq == sd == 0 with a centre
// of 0 or of magnitude >= 2^-50: floats within 2^-75 of such a centre, where squares would underflow, are the
// centre itself). Below 2^-80 squares can be subnormal, each off by up to 2^-149, so for sq >= 2^-80 those losses,
// at most len 2^-149 per tile, stay below 2^-56 of it. Every other tile (extreme data only: deviations beyond about
// 3e18, where float32 squares overflow, or all below about 1e-13) takes float64 passes over the same values (the tile is in cache, so memory is still read
// once): float64 holds the square of any difference of float32 values (< 2^258) and of any subnormal, so the
// statistics of finite input stay finite and precise up to float max, and NaN or inf input still gives NaN. The
// one tile taken for constant that is not: values within 2^-75 of 0, not all 0, summing to exactly 0 (its M2 is
// then off by less than len 2^-149: a variance below float32's smallest subnormal). float64 input takes no such
// check: its squares overflow only past |x - mean| ~ 1e154, as PyTorch's own float64 BatchNorm does.
#pragma once
#include <cmath>

#include "vec_io.h"

namespace syncbn::cpu::detail {

// Count, mean (relative to the channel's shift) and M2 of one channel, merged with Chan et al.'s pairwise formula
// (stable for |mean| >> std, unlike sum / sum-of-squares). Kept in float64: merges happen once per tile.
struct Moments {
  int64_t n = 0;
  double mean = 0.0;
  double m2 = 0.0;

  inline void merge(int64_t nb, double mean_b, double m2_b) {
    if (nb == 0) return;
    if (n == 0) {
      n = nb;
      mean = mean_b;
      m2 = m2_b;
      return;
    }
    const int64_t nt = n + nb;
    const double delta = mean_b - mean;
    const double wb = static_cast<double>(nb) / static_cast<double>(nt);
    mean += delta * wb;
    m2 += m2_b + delta * (delta * (static_cast<double>(n) * wb));
    n = nt;
  }
  inline void merge(const Moments& o) { merge(o.n, o.mean, o.m2); }
};

// max(x, 0) that keeps a NaN (std::max(0.0, NaN) is 0.0: a NaN input must not come out as a plausible M2).
inline double non_negative(double x) { return x < 0.0 ? 0.0 : x; }

// Sums of squared deviations reach float64 after at most kSquareRun float32 terms per lane. A float32 running sum
// drops the low bits of each square it adds, and for data on float32's grid near a large mean (|mean| / std of
// 1e3 to 1e5: any float32 data there) those bits are biased (squares of integers are 0 or 1 mod 4), so over many
// terms the error grows instead of averaging out: 4096 terms were 4e-6 of the variance, 100x PyTorch's
// float64-accumulated var_mean. A sum of 4 squares rounds below 2^-22 of a term (at most ~1e-7 of the variance,
// biased or not), and one conversion per 4 terms keeps the float64 work small.
constexpr int64_t kSquareRun = 4;
// Contiguous planes hold their float32 squares for up to 8 vector steps: fewer conversions where pass 2 is the
// loop's whole work (bfloat16 planes' pass 2 is bound by arithmetic, not memory); 8 terms round below 2^-21 of
// a term.
constexpr int64_t kPlaneSquareRun = 8;

// Whether a tile's float32 pass 2 around `centre`, which gave sum(d) = sd and sum(d^2) = sq, is exact enough (see the
// top of this file); float64 input always is.
inline bool float_sums_hold(float centre, double sd, double sq) {
  if (!(std::isfinite(sd) && std::isfinite(sq))) return false;
  if (sq >= 0x1p-80) return true;
  return sq == 0.0 && sd == 0.0 && (centre == 0.0f || std::abs(centre) >= 0x1p-50f);
}
inline bool float_sums_hold(double /*centre*/, double /*sd*/, double /*sq*/) { return true; }

// float_sums_hold for every one of n channels, written without branches (x - x == 0 is false exactly for inf and NaN)
// so that the loop vectorises: the rows walk checks every channel of every tile.
inline bool all_float_sums_hold(const float* centre, const float* sd, const double* sq, int64_t n) {
  int bad = 0;
  for (int64_t c = 0; c < n; ++c) {
    const double d = sd[c], q = sq[c];
    const float k = centre[c];
    const bool finite = (d - d == 0.0) & (q - q == 0.0);
    const bool constant = (q == 0.0) & (d == 0.0) & ((k == 0.0f) | (std::abs(k) >= 0x1p-50f));
    bad |= static_cast<int>(!(finite & ((q >= 0x1p-80) | constant)));
  }
  return bad == 0;
}
inline bool all_float_sums_hold(const double* /*centre*/, const double* /*sd*/, const double* /*sq*/, int64_t /*n*/) {
  return true;
}

// Pass 1 over `len` contiguous values of one channel: sum(x - k) (two accumulators hide the add latency; the tail's
// lanes past len are masked to exactly 0).
template <typename scalar_t>
inline acc_type<scalar_t> shifted_sum(const scalar_t* p, int64_t len, acc_type<scalar_t> k) {
  using IO = VecIO<scalar_t>;
  using acc_t = typename IO::acc_t;
  using AVec = typename IO::AVec;
  const int64_t vec_end = len - len % IO::kStep;
  const AVec vk(k);
  AVec s0(0), s1(0), a, b;
  for (int64_t i = 0; i < vec_end; i += IO::kStep) {
    IO::load(p + i, a, b);
    s0 += a - vk;
    s1 += b - vk;
  }
  if (vec_end < len) {
    AVec ma, mb;
    tail_masks<acc_t>(len - vec_end, ma, mb);
    IO::load_tail(p + vec_end, len - vec_end, acc_t(0), a, b);
    s0 += (a - vk) & ma;
    s1 += (b - vk) & mb;
  }
  return hsum<acc_t>(s0 + s1);
}

// Pass 2 over the same values: sum(d) and sum(d^2), d = x - centre, for the corrected two-pass formula
// M2 = sum(d^2) - sum(d)^2/len (exact even when the centre is off by rounding); sum(d^2) reaches float64 every
// kPlaneSquareRun steps.
template <typename scalar_t>
inline void centered_sums(const scalar_t* p, int64_t len, acc_type<scalar_t> centre, double& sd, double& sq) {
  using IO = VecIO<scalar_t>;
  using acc_t = typename IO::acc_t;
  using AVec = typename IO::AVec;
  const int64_t vec_end = len - len % IO::kStep;
  const AVec vm(centre);
  AVec d0(0), d1(0), a, b;
  DVec s0(0.0), s1(0.0), s2(0.0), s3(0.0);
  for (int64_t i = 0; i < len;) {
    AVec q0(0), q1(0);
    const int64_t run_end = std::min(vec_end, i + kPlaneSquareRun * IO::kStep);
    for (; i < run_end; i += IO::kStep) {
      IO::load(p + i, a, b);
      a -= vm;
      b -= vm;
      d0 += a;
      d1 += b;
      q0 = at::vec::fmadd(a, a, q0);
      q1 = at::vec::fmadd(b, b, q1);
    }
    if (i == vec_end && vec_end < len) {  // the tail joins the last run; lanes past len give d = 0 exactly
      AVec ma, mb;
      tail_masks<acc_t>(len - vec_end, ma, mb);
      IO::load_tail(p + vec_end, len - vec_end, acc_t(0), a, b);
      a = (a - vm) & ma;
      b = (b - vm) & mb;
      d0 += a;
      d1 += b;
      q0 = at::vec::fmadd(a, a, q0);
      q1 = at::vec::fmadd(b, b, q1);
      i = len;
    }
    add_widened(q0, s0, s1);
    add_widened(q1, s2, s3);
  }
  sd = static_cast<double>(hsum<acc_t>(d0 + d1));
  sq = hsum_double((s0 + s1) + (s2 + s3));
}

// A tile's mean relative to k and its M2 from pass 2's sums around `centre`, over len = 1 / inv_len values (a
// reciprocal the caller computes once: two divisions per channel and tile were a visible share of the rows walk).
template <typename acc_t>
inline void tile_result(double inv_len, acc_t centre, acc_t k, double sd, double sq, double& mean, double& m2) {
  // centre - k is exact in float64 for float32 values, and for float64 ones close to each other (Sterbenz).
  const double mean_d = sd * inv_len;
  mean = (static_cast<double>(centre) - static_cast<double>(k)) + mean_d;
  m2 = non_negative(sq - sd * mean_d);
}

// The float64 passes for a tile the float32 ones cannot take (see the top of this file): `len` values of one
// channel, `stride` apart. Rare (extreme magnitudes only), so plain scalar code, and out of line: inlined, it made
// the compiler stop inlining the hot passes around it.
template <typename scalar_t>
__attribute__((noinline)) void wide_moments(const scalar_t* p, int64_t len, int64_t stride, double k, double& mean, double& m2) {
  const double dl = static_cast<double>(len);
  double s = 0.0;
  for (int64_t i = 0; i < len; ++i) s += static_cast<double>(p[i * stride]) - k;
  const double centre = s / dl;
  double sd = 0.0, sq = 0.0;
  for (int64_t i = 0; i < len; ++i) {
    const double d = (static_cast<double>(p[i * stride]) - k) - centre;
    sd += d;
    sq += d * d;
  }
  mean = centre + sd / dl;
  m2 = non_negative(sq - sd * sd / dl);
}

// Mean (relative to k) and M2 of `len` contiguous values of one channel, in two passes over data that is already
// in L1/L2 (the caller tiles).
template <typename scalar_t>
inline void contiguous_moments(const scalar_t* p, int64_t len, acc_type<scalar_t> k, double& mean, double& m2) {
  using acc_t = acc_type<scalar_t>;
  const acc_t centre = k + shifted_sum(p, len, k) / static_cast<acc_t>(len);
  double sd, sq;
  centered_sums(p, len, centre, sd, sq);
  if (float_sums_hold(centre, sd, sq))
    tile_result(1.0 / static_cast<double>(len), centre, k, sd, sq, mean, m2);
  else
    wide_moments(p, len, 1, static_cast<double>(k), mean, m2);
}

}  // namespace syncbn::cpu::detail
