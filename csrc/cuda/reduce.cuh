// Device building blocks shared by the SyncBN kernels: aligned vector loads, per-thread Welford and sum
// states, and the block reduction (warp shuffles, then shared memory across warps).
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "runtime.cuh"

namespace syncbn::cuda::detail {

// Every streaming kernel runs 256-thread blocks: 8 resident blocks fill an SM's 2048 thread slots and the
// shared-memory reduction below is sized for it.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Loads a thread issues before it consumes any of them: keeps enough bytes in flight to saturate HBM.
constexpr int kUnroll = 4;
// Bytes per vector access (LDG.128 / STG.128).
constexpr int kVecBytes = 16;

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T val[V];
};

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load_vec(SYNCBN_PTR(const T) p) {
  return simt::device_load<Vec<T, V>>(p);
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(SYNCBN_PTR(T) p, const Vec<T, V>& v) {
  simt::device_store<Vec<T, V>>(p, v);
}

// The part of one channel a channels-first block walks: planes n = n0, n0 + n_step, ... and, in each,
// the vectors [s0, s1) (blockIdx.y enumerates n-splits x s-splits, s fastest; see launch.cuh).
struct PlaneRange {
  int64_t n0, n_step, s0, s1;
};

__device__ __forceinline__ PlaneRange plane_range(int64_t sv, int splits, int s_splits, int64_t chunk) {
  const int gn = int(blockIdx.y) / s_splits;
  const int gs = int(blockIdx.y) % s_splits;
  PlaneRange r;
  r.n0 = int64_t(gn) * blockDim.y + threadIdx.y;
  r.n_step = int64_t(splits / s_splits) * blockDim.y;
  r.s0 = int64_t(gs) * chunk + threadIdx.x;
  const int64_t end = int64_t(gs + 1) * chunk;
  r.s1 = end < sv ? end : sv;
  return r;
}

// Running (count, mean, M2) of V channels that have seen the same number of values (one thread reads
// the same rows for all its channels), so the count and the merge weight are shared. The stats kernels merge
// their threads' statistics in float64 with it.
template <typename acc_t, int V>
struct Welford {
  acc_t n;
  acc_t mean[V];
  acc_t m2[V];

  __device__ __forceinline__ void reset() {
    n = acc_t(0);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      mean[v] = acc_t(0);
      m2[v] = acc_t(0);
    }
  }

  // Chan et al.: M2 = M2a + M2b + d^2 * na * nb / n. An empty side leaves the other unchanged.
  // d * (d * cross), not d * d * cross: with an empty side cross = 0 and |d| = |mean| may exceed
  // sqrt(FLT_MAX) (~1.8e19) while M2 itself is small, so d * d would be inf and inf * 0 NaN.
  __device__ __forceinline__ void merge(const Welford& o) {
    const acc_t tot = n + o.n;
    const acc_t w = tot > acc_t(0) ? o.n / tot : acc_t(0);
    const acc_t cross = n * w;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const acc_t d = o.mean[v] - mean[v];
      mean[v] += d * w;
      m2[v] += o.m2[v] + d * (d * cross);
    }
    n = tot;
  }

  // The result of a reduction that could not be done (see block_reduce): NaN, never a plausible number.
  __device__ __forceinline__ void set_nan() {
    const acc_t nan = acc_t(::nan(""));
    n = nan;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      mean[v] = nan;
      m2[v] = nan;
    }
  }

  __device__ __forceinline__ Welford shfl_xor(int lane_mask) const {
    Welford o;
    o.n = __shfl_xor_sync(0xffffffffu, n, lane_mask);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      o.mean[v] = __shfl_xor_sync(0xffffffffu, mean[v], lane_mask);
      o.m2[v] = __shfl_xor_sync(0xffffffffu, m2[v], lane_mask);
    }
    return o;
  }
};

// Products and fused multiply-adds rounded as written: nvcc contracts a * b + c into one fma by default, which
// would break the error-free transformation in shifted_chunk. (The emulated build is compiled with
// -ffp-contract=off, so its plain operators are already these.)
#if defined(SYNCBN_SIMT)
template <typename T>
__device__ __forceinline__ T mul_rn(T a, T b) {
  return a * b;
}
template <typename T>
__device__ __forceinline__ T fma_rn(T a, T b, T c) {
  return std::fma(a, b, c);
}
#else
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fma_rn(double a, double b, double c) { return __fma_rn(a, b, c); }
#endif

// A thread's running statistics of V channels that have seen the same number n of values, kept around a
// per-channel shift k (the channel's first value, the same in every thread and block: every x - k is then exact
// for |mean| >> std, where rounding the running mean itself to acc_t would lose the spread, and the merges of
// threads and blocks add means relative to k, numbers of the order of the std rather than of the mean, which at
// |mean| / std = 1e8 lost 1e-8 of a float64 variance): s1 = sum(x - k) in acc_t, s2 = sum((x - k)^2) in float64. float32 sums of squares lose the low bits of every square, and for
// data on float32's grid near a large mean those bits are biased (squares of integers are 0 or 1 mod 4), so the
// error would grow with the number of terms; each chunk's squares are summed exactly instead (shifted_chunk)
// and then added in float64. float64 work is one add per chunk and channel, so GPUs with slow float64 pay
// almost nothing for it.
//
// Range. The float32 sums hold only where nothing overflowed and no square was subnormal (exact(), checked once at
// the end, so the loop carries no test); a thread whose sums do not (extreme data only: deviations beyond about 3e18,
// where float32 squares overflow, or all below about 1e-13) folds its values again into WideSums, in float64 throughout, where the square of any
// difference of float32 values fits. So the statistics of any finite input are finite.
template <typename acc_t, int V>
struct ShiftedSums {
  acc_t n;
  acc_t k[V];
  acc_t s1[V];
  double s2[V];

  __device__ __forceinline__ void reset(const acc_t (&shift)[V]) {
    n = acc_t(0);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      k[v] = shift[v];
      s1[v] = acc_t(0);
      s2[v] = 0.0;
    }
  }

  // Whether the float32 sums are exact enough: s1 and s2 are finite (a square, a sum or an x - k that overflowed
  // leaves inf or NaN in them) and s2 is at least 2^-80, or the channel is constant here (s2 == s1 == 0 with k = 0 or
  // |k| >= 2^-50: floats within 2^-75 of such a k, where squares would underflow, are k itself). Below 2^-80
  // squares' rounding errors can be subnormal and inexact, at most 2^-149 per value, so for s2 >= 2^-80 they stay
  // below n 2^-69 of s2. The one case taken for constant that is not: values within 2^-75 of k = 0, not all 0,
  // summing to exactly 0 (M2 off by less than n 2^-149: a variance below float32's smallest subnormal). float64
  // input needs no check: its squares overflow only past |x - k| ~ 1e154, as float64 BatchNorm's do.
  __device__ __forceinline__ bool exact() const {
    if constexpr (std::is_same_v<acc_t, double>) {
      return true;
    } else {
      bool ok = true;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const bool finite = s2[v] <= 0x1.fffffffffffffp1023 && s1[v] <= 0x1.fffffep127f && s1[v] >= -0x1.fffffep127f;
        const bool constant = s2[v] == 0.0 && s1[v] == acc_t(0) && (k[v] == acc_t(0) || fabsf(k[v]) >= 0x1p-50f);
        ok = ok && finite && (s2[v] >= 0x1p-80 || constant);
      }
      return ok;
    }
  }

  // The same statistics as (count, mean - k, M2) in float64, for the block's merge. M2 = s2 - s1^2 / n loses at
  // most log2(1 + n (mean - k)^2 / M2) of float64's 53 bits (k is one of the channel's values, so typically a few).
  // A NaN M2 (NaN input) stays NaN.
  __device__ __forceinline__ Welford<double, V> moments() const {
    Welford<double, V> w;
    w.n = double(n);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const double q = n > acc_t(0) ? double(s1[v]) / double(n) : 0.0;
      w.mean[v] = q;
      const double m2 = s2[v] - double(s1[v]) * q;
      w.m2[v] = m2 < 0.0 ? 0.0 : m2;
    }
    return w;
  }
};

// The same sums in float64 throughout, for a thread whose values ShiftedSums could not take exactly: the statistics
// kernels walk its values a second time into these, one row of V channels at a time (stats.cu).
template <int V>
struct WideSums {
  double n;
  double k[V];
  double s1[V];
  double s2[V];

  template <typename acc_t>
  __device__ __forceinline__ void reset(const acc_t (&shift)[V]) {
    n = 0.0;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      k[v] = double(shift[v]);
      s1[v] = 0.0;
      s2[v] = 0.0;
    }
  }

  // Folds one row of V channels into the sums.
  __device__ __forceinline__ void fold(const double (&x)[V]) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const double d = x[v] - k[v];
      s1[v] += d;
      s2[v] += d * d;
    }
    n += 1.0;
  }

  // (count, mean - k, M2), as ShiftedSums::moments.
  __device__ __forceinline__ Welford<double, V> moments() const {
    Welford<double, V> w;
    w.n = n;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const double q = n > 0.0 ? s1[v] / n : 0.0;
      w.mean[v] = q;
      const double m2 = s2[v] - s1[v] * q;
      w.m2[v] = m2 < 0.0 ? 0.0 : m2;
    }
    return w;
  }
};

// Folds K values per channel into the state. The chunk's sum of squares is exact: each square as p + e
// (e = fma(d, d, -p), exactly representable) and each addition as t + its rounding error (Knuth's two-sum),
// the errors gathered in `err`; only the float64 total rounds.
template <int K, typename acc_t, int V>
__device__ __forceinline__ void shifted_chunk(ShiftedSums<acc_t, V>& s, const acc_t (&x)[K][V]) {
#pragma unroll
  for (int v = 0; v < V; ++v) {
    acc_t sum = acc_t(0), sq = acc_t(0), err = acc_t(0);
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const acc_t d = x[i][v] - s.k[v];
      sum += d;
      const acc_t p = mul_rn(d, d);
      err += fma_rn(d, d, -p);
      const acc_t t = sq + p;
      const acc_t bp = t - sq;
      err += (sq - (t - bp)) + (p - bp);
      sq = t;
    }
    s.s1[v] += sum;
    s.s2[v] += double(sq) + double(err);
  }
  s.n += acc_t(K);
}

// Two per-channel sums of V channels (the backward's sum(dy) and sum(dy * (x - mean))).
template <typename acc_t, int V>
struct SumPair {
  acc_t a[V];
  acc_t b[V];

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      a[v] = acc_t(0);
      b[v] = acc_t(0);
    }
  }

  __device__ __forceinline__ void merge(const SumPair& o) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      a[v] += o.a[v];
      b[v] += o.b[v];
    }
  }

  __device__ __forceinline__ void set_nan() {
    const acc_t nan = acc_t(::nan(""));
#pragma unroll
    for (int v = 0; v < V; ++v) {
      a[v] = nan;
      b[v] = nan;
    }
  }

  __device__ __forceinline__ SumPair shfl_xor(int lane_mask) const {
    SumPair o;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      o.a[v] = __shfl_xor_sync(0xffffffffu, a[v], lane_mask);
      o.b[v] = __shfl_xor_sync(0xffffffffu, b[v], lane_mask);
    }
    return o;
  }
};

// Reduces `s` over the threads of a block that share the same column tx = tid % group, where `group` is a
// power of two <= 32 (group = 1 reduces the whole block). Threads are linearised x-fastest, so lanes of one
// column sit `group` apart in a warp: a butterfly over offsets group..16 merges them, then one thread per
// column merges the warp results in a fixed order (deterministic). Every launch today uses kThreads
// threads, but the block may be any whole number of warps up to kThreads: only the warps the block has are
// merged (unwritten shared slots hold garbage on a GPU). Any other block (more than kThreads threads would
// overrun `partial`; a partial warp makes the full-mask shuffles undefined) gets NaN: a device-side guard
// that turns a wrong launch into a visible NaN instead of a plausible wrong number. The condition is
// uniform over the block, so no thread reaches the barrier alone.
// Every thread of the block must call it (it has a __syncthreads). The result is valid where tid < group.
template <typename State>
__device__ __forceinline__ State block_reduce(State s, int group) {
  const int threads = int(blockDim.x * blockDim.y * blockDim.z);
  if (threads > kThreads || threads % 32 != 0) {
    s.set_nan();
    return s;
  }
  for (int off = group; off < 32; off <<= 1) s.merge(s.shfl_xor(off));
  __shared__ State partial[kWarps][32];
  const int tid = int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warps = threads >> 5;
  if (lane < group) partial[warp][lane] = s;
  __syncthreads();
  if (tid < group) {
    s = partial[0][tid];
#pragma unroll
    for (int w = 1; w < kWarps; ++w)
      if (w < warps) s.merge(partial[w][tid]);
  }
  return s;
}

}  // namespace syncbn::cuda::detail
