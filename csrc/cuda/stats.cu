// batch_norm_stats: per-channel count, mean and M2 of x in one read, packed as float64 [count, mean(C),
// m2(C)]. Each thread folds chunks of its values into sums around a shift (reduce.cuh's ShiftedSums: the squares
// of a chunk summed exactly, then in float64), the block merges its threads' statistics in float64 (warp
// shuffles, then shared memory), and when a channel is split across several blocks a second tiny kernel merges
// the per-block partials in float64. As precise as PyTorch's float64-accumulated CPU var_mean, for any
// |mean| / std the input's dtype can hold, and finite up to float max: a thread whose float32 sums overflowed or
// lost squares to underflow (extreme magnitudes only) walks its values again in float64 (wide_channels_*).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include "launch.cuh"
#include "occupancy.cuh"
#include "../ops.h"

namespace syncbn::cuda {
namespace detail {
namespace {

// Writes one channel's result, its mean as the channel's shift k plus the mean relative to k: straight into `out`
// when the channel had a single block, else into the float64 partials [3][C][splits] that stats_finalize_kernel
// merges (means relative to k; block 0 leaves k in out's mean for it).
__device__ __forceinline__ void store_stats(SYNCBN_PTR(double) out, SYNCBN_PTR(double) partial, int64_t C, int splits, int64_t c,
                                            int64_t g, double n, double k, double mean, double m2) {
  if (splits == 1) {
    out[1 + c] = k + mean;
    out[1 + C + c] = m2;
  } else {
    partial[c * splits + g] = n;
    partial[(C + c) * splits + g] = mean;
    partial[(2 * C + c) * splits + g] = m2;
    if (g == 0) out[1 + c] = k;
  }
}

// Channel c's shift: its first value (sample 0, first position), which every thread of every block reads alike.
template <typename T>
__device__ __forceinline__ at::opmath_type<T> channel_shift(SYNCBN_PTR(const T) first) {
  return at::opmath_type<T>(load_vec<T, 1>(first).val[0]);
}

// The values of channel c that thread's PlaneRange r covers (the walk of stats_channels_first_kernel, one value at a
// time), folded in float64 throughout: the rare path of a thread whose float32 sums could not take them exactly
// (ShiftedSums::exact, reduce.cuh). A plain loop, not unrolled: it must not need more registers than the
// kernel's main loop.
template <typename T, int VEC>
__device__ __forceinline__ Welford<double, 1> wide_channels_first(SYNCBN_PTR(const T) x, int64_t N, int64_t C,
                                                                  int64_t S, int64_t c, PlaneRange r, int bx,
                                                                  const at::opmath_type<T> (&k)[1]) {
  WideSums<1> w;
  w.reset(k);
#pragma unroll 1
  for (int64_t n = r.n0; n < N; n += r.n_step) {
    const auto plane = x + (n * C + c) * S;
#pragma unroll 1
    for (int64_t s = r.s0; s < r.s1; s += bx) {
      const Vec<T, VEC> v = load_vec<T, VEC>(plane + s * VEC);
      for (int i = 0; i < VEC; ++i) {
        const double value[1] = {double(at::opmath_type<T>(v.val[i]))};
        w.fold(value);
      }
    }
  }
  return w.moments();
}

// The rows of channels c0..c0+VEC-1 that thread's walk of stats_channels_last_kernel covers, folded in float64
// throughout (see wide_channels_first).
template <typename T, int VEC>
__device__ __forceinline__ Welford<double, VEC> wide_channels_last(SYNCBN_PTR(const T) x, int64_t M, int64_t C,
                                                                   int64_t c0, int64_t m0, int64_t stride) {
  const Vec<T, VEC> first = load_vec<T, VEC>(x + c0);  // the channels' shifts, as the kernel read them
  double k[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) k[i] = double(at::opmath_type<T>(first.val[i]));
  WideSums<VEC> w;
  w.reset(k);
#pragma unroll 1
  for (int64_t m = m0; m < M; m += stride) {
    const Vec<T, VEC> v = load_vec<T, VEC>(x + m * C + c0);
    double values[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) values[i] = double(at::opmath_type<T>(v.val[i]));
    w.fold(values);
  }
  return w.moments();
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    stats_channels_first_kernel(SYNCBN_PTR(const T) x, int64_t N, int64_t C, int64_t S, int splits, int s_splits, int64_t chunk,
                                SYNCBN_PTR(double) partial, SYNCBN_PTR(double) out, double count) {
  using acc_t = at::opmath_type<T>;
  const int bx = blockDim.x;
  const int64_t c = blockIdx.x;
  const int64_t sv = S / VEC;
  const acc_t k[1] = {channel_shift<T>(x + c * S)};
  ShiftedSums<acc_t, 1> st;
  st.reset(k);
  const PlaneRange r = plane_range(sv, splits, s_splits, chunk);
  for (int64_t n = r.n0; n < N; n += r.n_step) {
    const auto plane = x + (n * C + c) * S;
    for (int64_t s = r.s0; s < r.s1; s += int64_t(kUnroll) * bx) {
      Vec<T, VEC> v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (s + u * bx < r.s1) v[u] = load_vec<T, VEC>(plane + (s + u * bx) * VEC);
      if (s + (kUnroll - 1) * bx < r.s1) {
        acc_t vals[kUnroll * VEC][1];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int i = 0; i < VEC; ++i) vals[u * VEC + i][0] = acc_t(v[u].val[i]);
        shifted_chunk(st, vals);
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (s + u * bx < r.s1) {
            acc_t vals[VEC][1];
#pragma unroll
            for (int i = 0; i < VEC; ++i) vals[i][0] = acc_t(v[u].val[i]);
            shifted_chunk(st, vals);
          }
        }
      }
    }
  }
  const Welford<double, 1> m =
      block_reduce(st.exact() ? st.moments() : wide_channels_first<T, VEC>(x, N, C, S, c, r, bx, k), 1);
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    store_stats(out, partial, C, splits, c, blockIdx.y, m.n, double(k[0]), m.mean[0], m.m2[0]);
    if (splits == 1 && c == 0) out[0] = count;
  }
}

// Resident blocks per SM the vectorised channels-last kernels must allow (__launch_bounds__' second argument): 2 for
// the 16-bit types (docs/gpu.md), 4 otherwise, what they reached before each thread loaded its channels' shifts up
// front, for which ptxas would otherwise give up an occupancy step. The scalar kernels need no bound (40 registers).
template <typename T, int VEC>
constexpr int kChannelsLastBlocks = VEC == 1 ? 1 : sizeof(T) == 2 ? 2 : 4;

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads, kChannelsLastBlocks<T, VEC>)
    stats_channels_last_kernel(SYNCBN_PTR(const T) x, int64_t M, int64_t C, int splits,
                               SYNCBN_PTR(double) partial, SYNCBN_PTR(double) out, double count) {
  using acc_t = at::opmath_type<T>;
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  const bool active = c0 < C;
  const int64_t stride = int64_t(splits) * blockDim.y;
  acc_t k[VEC] = {};
  if (active) {
    const Vec<T, VEC> first = load_vec<T, VEC>(x + c0);  // row 0: each channel's first value
#pragma unroll
    for (int i = 0; i < VEC; ++i) k[i] = acc_t(first.val[i]);
  }
  ShiftedSums<acc_t, VEC> st;
  st.reset(k);
  if (active) {
    for (int64_t m = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; m < M; m += kUnroll * stride) {
      Vec<T, VEC> v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (m + u * stride < M) v[u] = load_vec<T, VEC>(x + (m + u * stride) * C + c0);
      if (m + (kUnroll - 1) * stride < M) {
        acc_t vals[kUnroll][VEC];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int i = 0; i < VEC; ++i) vals[u][i] = acc_t(v[u].val[i]);
        shifted_chunk(st, vals);
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (m + u * stride < M) {
            acc_t vals[1][VEC];
#pragma unroll
            for (int i = 0; i < VEC; ++i) vals[0][i] = acc_t(v[u].val[i]);
            shifted_chunk(st, vals);
          }
        }
      }
    }
  }
  // Inactive threads (channels past C) still join the reduction: it has a barrier.
  const Welford<double, VEC> m = block_reduce(
      st.exact() ? st.moments()
                 : wide_channels_last<T, VEC>(x, M, C, c0, int64_t(blockIdx.y) * blockDim.y + threadIdx.y, stride),
      blockDim.x);
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int i = 0; i < VEC; ++i)
      store_stats(out, partial, C, splits, c0 + i, blockIdx.y, m.n, double(k[i]), m.mean[i], m.m2[i]);
    if (splits == 1 && c0 == 0) out[0] = count;
  }
}

// One warp per channel merges the `splits` float64 partials of stats_*_kernel (means relative to the channel's
// shift, which block 0 left in out's mean).
__global__ void stats_finalize_kernel(SYNCBN_PTR(const double) partial, int64_t C, int splits,
                                      SYNCBN_PTR(double) out, double count) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && threadIdx.y == 0) out[0] = count;
  const int64_t c = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (c >= C) return;  // the whole warp shares c, so the shuffles below stay full-warp
  Welford<double, 1> st;
  st.reset();
  for (int g = threadIdx.x; g < splits; g += 32) {
    Welford<double, 1> o;
    o.n = partial[c * splits + g];
    o.mean[0] = partial[(C + c) * splits + g];
    o.m2[0] = partial[(2 * C + c) * splits + g];
    st.merge(o);
  }
  for (int off = 1; off < 32; off <<= 1) st.merge(st.shfl_xor(off));
  if (threadIdx.x == 0) {
    out[1 + c] += st.mean[0];
    out[1 + C + c] = st.m2[0];
  }
}

template <typename T, int VEC>
void launch_stats(const at::Tensor& x, const Layout& l, const at::Tensor& out, double count) {
  // Sized by the occupancy of the kernel this layout launches (the two differ in registers).
  const int device = x.get_device();
  const int64_t resident = l.channels_last ? resident_blocks(device, stats_channels_last_kernel<T, VEC>, kThreads)
                                           : resident_blocks(device, stats_channels_first_kernel<T, VEC>, kThreads);
  const Geometry geo = geometry(l, VEC, resident);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  double* out_ptr = out.data_ptr<double>();
  at::Tensor partial;
  double* partial_ptr = nullptr;
  if (geo.splits > 1) {
    partial = at::empty({3 * l.c * geo.splits}, out.options());
    partial_ptr = partial.data_ptr<double>();
  }
  const T* x_ptr = x.const_data_ptr<T>();
  if (l.channels_last) {
    SYNCBN_LAUNCH(geo.grid, geo.block, 0, stream, stats_channels_last_kernel<T, VEC>)(
        x_ptr, l.rows(), l.c, geo.splits, partial_ptr, out_ptr, count);
  } else {
    SYNCBN_LAUNCH(geo.grid, geo.block, 0, stream, stats_channels_first_kernel<T, VEC>)(
        x_ptr, l.n, l.c, l.s, geo.splits, geo.s_splits, geo.chunk, partial_ptr, out_ptr, count);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (geo.splits > 1) {
    const dim3 block(32, kFinalizeWarps);
    const dim3 grid(unsigned(ceil_div(l.c, kFinalizeWarps)));
    SYNCBN_LAUNCH(grid, block, 0, stream, stats_finalize_kernel)(partial_ptr, l.c, geo.splits, out_ptr, count);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

}  // namespace
}  // namespace detail

at::Tensor batch_norm_stats(const at::Tensor& input) {
  using namespace detail;
  const Layout l = check_input(input, "batch_norm_stats");
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor& x = input;
  const auto opts = x.options().dtype(at::kDouble).memory_format(at::MemoryFormat::Contiguous);
  // Empty batch (or C == 0): count = mean = m2 = 0, and no kernel with an empty grid.
  if (x.numel() == 0) return at::zeros({2 * l.c + 1}, opts);
  at::Tensor out = at::empty({2 * l.c + 1}, opts);
  // numel / C < 2^53 is exact in float64; it is known on the host, so no device round trip.
  const double count = double(l.rows());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_batch_norm_stats_cuda", [&] {
    constexpr int kVec = kVecBytes / sizeof(scalar_t);
    if (can_vectorize(l, kVec, {x.const_data_ptr()}))
      launch_stats<scalar_t, kVec>(x, l, out, count);
    else
      launch_stats<scalar_t, 1>(x, l, out, count);
  });
  return out;
}

void stats_occupancy(std::vector<KernelOccupancy>& out) {
  using namespace detail;
  add_occupancy(out, "stats_channels_first<float,4>", stats_channels_first_kernel<float, 4>, kThreads);
  add_occupancy(out, "stats_channels_first<bfloat16,8>", stats_channels_first_kernel<at::BFloat16, 8>, kThreads);
  add_occupancy(out, "stats_channels_last<float,4>", stats_channels_last_kernel<float, 4>, kThreads);
  add_occupancy(out, "stats_channels_last<bfloat16,8>", stats_channels_last_kernel<at::BFloat16, 8>, kThreads);
  add_occupancy(out, "stats_finalize", stats_finalize_kernel, 32 * kFinalizeWarps);
}

}  // namespace syncbn::cuda
