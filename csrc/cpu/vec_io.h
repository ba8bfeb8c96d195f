// Vector loads/stores that widen any supported dtype to its accumulation type, plus the
// per-channel moment merge. Private to csrc/cpu/.
//
// Why at::vec::Vectorized: it follows the CPU_CAPABILITY_* macro the extension is compiled with
// (src/syncbn/extension.py builds one library per capability: default, AVX2, AVX512), so the same
// source gives scalar, 256-bit or 512-bit code.
#pragma once
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace syncbn::cpu::detail {

// float64 input accumulates in float64, everything else (float32, float16, bfloat16) in float32.
template <typename scalar_t>
using acc_type = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

// Loads/stores kStep consecutive scalar_t values as two acc-type vectors (a: first half, b: second).
// kStep is the same for float and the 16-bit types, so one loop shape serves every dtype.
template <typename scalar_t>
struct VecIO {
  using acc_t = acc_type<scalar_t>;
  using AVec = at::vec::Vectorized<acc_t>;
  static constexpr int64_t kWidth = AVec::size();
  static constexpr int64_t kStep = 2 * kWidth;

  static inline void load(const scalar_t* p, AVec& a, AVec& b) {
    if constexpr (std::is_same_v<scalar_t, acc_t>) {
      a = AVec::loadu(p);
      b = AVec::loadu(p + kWidth);
    } else {
      auto v = at::vec::Vectorized<scalar_t>::loadu(p);
      std::tie(a, b) = at::vec::convert_to_float<scalar_t>(v);
    }
  }

  static inline void store(scalar_t* p, const AVec& a, const AVec& b) {
    if constexpr (std::is_same_v<scalar_t, acc_t>) {
      a.store(p);
      b.store(p + kWidth);
    } else {
      at::vec::convert_from_float<scalar_t>(a, b).store(p);
    }
  }

  // Tail of 0 < count < kStep values with masked loads; lanes past `count` hold `pad` (so they can
  // be made to contribute exactly nothing to a reduction).
  static inline void load_tail(const scalar_t* p, int64_t count, acc_t pad, AVec& a, AVec& b) {
    const int64_t ca = std::min<int64_t>(count, kWidth), cb = count - ca;
    if constexpr (std::is_same_v<scalar_t, acc_t>) {
      a = AVec::loadu(p, ca);
      b = cb > 0 ? AVec::loadu(p + kWidth, cb) : AVec(acc_t(0));
    } else {
      auto v = at::vec::Vectorized<scalar_t>::loadu(p, count);
      std::tie(a, b) = at::vec::convert_to_float<scalar_t>(v);
    }
    if (pad != acc_t(0)) {
      a = AVec::set(AVec(pad), a, ca);
      b = AVec::set(AVec(pad), b, cb);
    }
  }

  static inline void store_tail(scalar_t* p, int64_t count, const AVec& a, const AVec& b) {
    const int64_t ca = std::min<int64_t>(count, kWidth), cb = count - ca;
    if constexpr (std::is_same_v<scalar_t, acc_t>) {
      a.store(p, ca);
      if (cb > 0) b.store(p + kWidth, cb);
    } else {
      at::vec::convert_from_float<scalar_t>(a, b).store(p, count);
    }
  }
};

// Horizontal sum of a float64 vector by shuffles: ATen's vec_reduce_all has SIMD code for float only, and its
// generic loop costs hundreds of cycles per call, which dominates on 7x7 planes.
inline double hsum_double(const at::vec::Vectorized<double>& v) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_reduce_add_pd(v);
#elif defined(CPU_CAPABILITY_AVX2)
  const __m256d x = v;
  const __m128d pair = _mm_add_pd(_mm256_castpd256_pd128(x), _mm256_extractf128_pd(x, 1));
  return _mm_cvtsd_f64(_mm_add_sd(pair, _mm_unpackhi_pd(pair, pair)));
#else
  __at_align__ double d[at::vec::Vectorized<double>::size()];
  v.store(d);
  double sum = 0.0;
  for (int64_t i = 0; i < at::vec::Vectorized<double>::size(); ++i) sum += d[i];
  return sum;
#endif
}

// Horizontal sum with a log-depth shuffle reduction (a store + serial loop would add ~60 cycles of
// latency per call, which dominates on 7x7 planes).
template <typename acc_t>
inline acc_t hsum(const at::vec::Vectorized<acc_t>& v) {
  if constexpr (std::is_same_v<acc_t, double>) {
    return hsum_double(v);
  } else {
    using V = at::vec::Vectorized<acc_t>;
    return at::vec::vec_reduce_all<acc_t>([](V& a, V& b) { return a + b; }, v);
  }
}

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

using DVec = at::vec::Vectorized<double>;

// Both halves of a float32 vector as float64 vectors.
inline void widen(const at::vec::Vectorized<float>& v, DVec& lo, DVec& hi) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m512 x = v;
  lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
#elif defined(CPU_CAPABILITY_AVX2)
  const __m256 x = v;
  lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
#else
  static_assert(at::vec::Vectorized<float>::size() == 2 * DVec::size(), "a float vector is two double vectors");
  __at_align__ float f[at::vec::Vectorized<float>::size()];
  v.store(f);
  __at_align__ double d[at::vec::Vectorized<float>::size()];
  for (int64_t i = 0; i < at::vec::Vectorized<float>::size(); ++i) d[i] = f[i];
  lo = DVec::loadu(d);
  hi = DVec::loadu(d + DVec::size());
#endif
}

// lo += v's first half and hi += its second, in float64 (a float64 v: lo += v); or the same into the doubles at
// q, as many as v has lanes.
inline void add_widened(const at::vec::Vectorized<float>& v, DVec& lo, DVec& hi) {
  DVec a, b;
  widen(v, a, b);
  lo += a;
  hi += b;
}

inline void add_widened(const DVec& v, DVec& lo, DVec& /*hi*/) { lo += v; }

inline void add_widened_to(const at::vec::Vectorized<float>& v, double* q) {
  DVec a, b;
  widen(v, a, b);
  (DVec::loadu(q) + a).store(q);
  (DVec::loadu(q + DVec::size()) + b).store(q + DVec::size());
}

inline void add_widened_to(const DVec& v, double* q) { (DVec::loadu(q) + v).store(q); }

// Count, mean and sum of squared deviations of one channel; merged with Chan et al.'s pairwise
// formula (stable for |mean| >> std, unlike sum/sum-of-squares). Kept in double: merges happen
// once per tile, so the cost is negligible and fp32 inputs lose nothing across tiles.
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
    m2 += m2_b + delta * delta * static_cast<double>(n) * wb;
    n = nt;
  }
  inline void merge(const Moments& o) { merge(o.n, o.mean, o.m2); }
};

// Pass 1: the sum of `len` contiguous values (two accumulators hide the add latency).
template <typename scalar_t>
inline typename VecIO<scalar_t>::acc_t contiguous_sum(const scalar_t* p, int64_t len) {
  using IO = VecIO<scalar_t>;
  using acc_t = typename IO::acc_t;
  using AVec = typename IO::AVec;
  const int64_t vec_end = len - len % IO::kStep;
  AVec s0(0), s1(0), a, b;
  for (int64_t i = 0; i < vec_end; i += IO::kStep) {
    IO::load(p + i, a, b);
    s0 += a;
    s1 += b;
  }
  if (vec_end < len) {
    IO::load_tail(p + vec_end, len - vec_end, acc_t(0), a, b);
    s0 += a;
    s1 += b;
  }
  return hsum<acc_t>(s0 + s1);
}

// Pass 2 over the same values: sum(d) and sum(d^2), d = x - mean0, for the corrected two-pass formula
// M2 = sum(d^2) - sum(d)^2/len (exact even when mean0 is off by rounding); sum(d^2) reaches float64 every
// kPlaneSquareRun steps.
template <typename scalar_t>
inline void centered_sums(const scalar_t* p, int64_t len, typename VecIO<scalar_t>::acc_t mean0, double& sd,
                          double& sq) {
  using IO = VecIO<scalar_t>;
  using acc_t = typename IO::acc_t;
  using AVec = typename IO::AVec;
  const int64_t vec_end = len - len % IO::kStep;
  const AVec vm(mean0);
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
    if (i == vec_end && vec_end < len) {  // the tail joins the last run
      IO::load_tail(p + vec_end, len - vec_end, mean0, a, b);  // padded lanes give d = 0 exactly
      a -= vm;
      b -= vm;
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

// Mean and M2 of `len` contiguous values in two passes over data that is already in L1/L2 (the
// caller tiles).
template <typename scalar_t>
inline void contiguous_moments(const scalar_t* p, int64_t len, double& mean_out, double& m2_out) {
  using acc_t = typename VecIO<scalar_t>::acc_t;
  const acc_t mean0 = contiguous_sum(p, len) / static_cast<acc_t>(len);
  double sd, sq;
  centered_sums(p, len, mean0, sd, sq);
  const double dl = static_cast<double>(len);
  mean_out = static_cast<double>(mean0) + sd / dl;
  m2_out = std::max(0.0, sq - sd * sd / dl);
}

}  // namespace syncbn::cpu::detail
