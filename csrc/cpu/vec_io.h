// Vector loads/stores that widen any supported dtype to its accumulation type, horizontal sums, and float32 ->
// float64 widening. Private to csrc/cpu/.
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

// kLanes all-ones lanes, then kLanes zero lanes (as bits of the acc type): loading kLanes values from kLanes - count
// gives `count` ones first.
template <typename bits_t, int64_t kLanes>
struct TailMaskTable {
  bits_t v[2 * kLanes];
  constexpr TailMaskTable() : v() {
    for (int64_t i = 0; i < kLanes; ++i) v[i] = ~bits_t(0);
  }
};
template <typename acc_t>
using MaskBits = std::conditional_t<std::is_same_v<acc_t, double>, uint64_t, uint32_t>;
template <typename acc_t>
alignas(64) inline constexpr TailMaskTable<MaskBits<acc_t>, 2 * at::vec::Vectorized<acc_t>::size()> kTailMasks{};

// Masks keeping lanes [0, count) of a kStep-lane step of acc_t values (a: first half, b: second) and zeroing the rest,
// for `x & mask`: a tail loaded with pad 0 then contributes exactly nothing beyond its count, also after subtracting
// a shift. (Padding through AVec::set costs a switch over count that the compiler need not inline, and then calls
// libtorch's interposable copy through the PLT: a tenth of the statistics' time on 3x3 planes.)
template <typename acc_t>
inline void tail_masks(int64_t count, at::vec::Vectorized<acc_t>& a, at::vec::Vectorized<acc_t>& b) {
  using AVec = at::vec::Vectorized<acc_t>;
  constexpr int64_t kStep = 2 * AVec::size();
  const acc_t* base = reinterpret_cast<const acc_t*>(kTailMasks<acc_t>.v + (kStep - count));
  a = AVec::loadu(base);
  b = AVec::loadu(base + AVec::size());
}

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

}  // namespace syncbn::cpu::detail
