// batch_norm_backward_elemt: dx = weight * invstd * (dy - sum_dy / n - xhat * sum_dy_xhat / n) in one read
// of x and dy and one write of dx. The global count n is read from the 0-d float64 device tensor that
// batch_norm_gather_stats produced, so the backward never waits on the host either.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty_like.h>

#include "launch.cuh"
#include "occupancy.cuh"
#include "../ops.h"

namespace syncbn::cuda {
namespace detail {
namespace {

template <typename T, typename P, typename acc_t>
struct BackwardArgs {
  SYNCBN_PTR(const T) dy;
  SYNCBN_PTR(const T) x;
  SYNCBN_PTR(T) dx;
  SYNCBN_PTR(const acc_t) mean;
  SYNCBN_PTR(const acc_t) invstd;
  SYNCBN_PTR(const P) weight;       // nullptr: 1
  SYNCBN_PTR(const acc_t) reduced;  // [sum_dy(C), sum_dy_xhat(C)], all-reduced
  SYNCBN_PTR(const double) count;   // 0-d, global count per channel
};

// Per-channel coefficients: dx = a * (dy - mdy - (x - mu) * k). A zero global count (every rank empty)
// gives dx = 0, as the contract says, without dividing by it: the kernels store zeros then (a = 0 alone
// would turn an inf or NaN in x or dy into NaN). A NaN count (gather's signal for invalid rows) gives
// inv_n = NaN and so NaN everywhere, as the forward's outputs and the CPU op are.
template <typename T, typename P, typename acc_t>
__device__ __forceinline__ void channel_coefficients(const BackwardArgs<T, P, acc_t>& p, int64_t C, int64_t c,
                                                     acc_t inv_n, acc_t& mu, acc_t& a, acc_t& mdy, acc_t& k) {
  const acc_t is = p.invstd[c];
  mu = p.mean[c];
  a = inv_n != acc_t(0) ? is * (p.weight != nullptr ? acc_t(p.weight[c]) : acc_t(1)) : acc_t(0);
  mdy = p.reduced[c] * inv_n;
  k = p.reduced[C + c] * inv_n * is;
}

// 1 / n; 0 for n <= 0 (no values anywhere: dx = 0); NaN for a NaN count (`n > 0` alone is false for NaN,
// which silently gave dx = 0).
template <typename acc_t>
__device__ __forceinline__ acc_t inverse_count(SYNCBN_PTR(const double) count) {
  const double n = *count;
  if (n > 0.0) return acc_t(1.0 / n);
  return n != n ? acc_t(n) : acc_t(0);
}

template <typename T, typename P, int VEC>
__global__ void __launch_bounds__(kThreads) backward_elemt_channels_first_kernel(
    BackwardArgs<T, P, at::opmath_type<T>> p, int64_t N, int64_t C, int64_t S, int splits, int s_splits, int64_t chunk) {
  using acc_t = at::opmath_type<T>;
  const int bx = blockDim.x;
  const int64_t c = blockIdx.x;
  const int64_t sv = S / VEC;
  const acc_t inv_n = inverse_count<acc_t>(p.count);
  const bool none = inv_n == acc_t(0);  // NaN: computed (and NaN), not zeroed
  acc_t mu, a, mdy, k;
  channel_coefficients(p, C, c, inv_n, mu, a, mdy, k);
  const PlaneRange r = plane_range(sv, splits, s_splits, chunk);
  for (int64_t n = r.n0; n < N; n += r.n_step) {
    const int64_t plane = (n * C + c) * S;
    for (int64_t s = r.s0; s < r.s1; s += int64_t(kUnroll) * bx) {
      Vec<T, VEC> g[kUnroll], v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (s + u * bx < r.s1) {
          g[u] = load_vec<T, VEC>(p.dy + plane + (s + u * bx) * VEC);
          v[u] = load_vec<T, VEC>(p.x + plane + (s + u * bx) * VEC);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (s + u * bx < r.s1) {
          Vec<T, VEC> o;
#pragma unroll
          for (int i = 0; i < VEC; ++i)
            o.val[i] = none ? T(0) : T(a * (acc_t(g[u].val[i]) - mdy - (acc_t(v[u].val[i]) - mu) * k));
          store_vec<T, VEC>(p.dx + plane + (s + u * bx) * VEC, o);
        }
      }
    }
  }
}

template <typename T, typename P, int VEC>
__global__ void __launch_bounds__(kThreads) backward_elemt_channels_last_kernel(
    BackwardArgs<T, P, at::opmath_type<T>> p, int64_t M, int64_t C, int splits) {
  using acc_t = at::opmath_type<T>;
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  if (c0 >= C) return;  // no barrier in this kernel
  const acc_t inv_n = inverse_count<acc_t>(p.count);
  const bool none = inv_n == acc_t(0);  // NaN: computed (and NaN), not zeroed
  acc_t mu[VEC], a[VEC], mdy[VEC], k[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) channel_coefficients(p, C, c0 + i, inv_n, mu[i], a[i], mdy[i], k[i]);
  const int64_t stride = int64_t(splits) * blockDim.y;
  for (int64_t m = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; m < M; m += kUnroll * stride) {
    Vec<T, VEC> g[kUnroll], v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (m + u * stride < M) {
        g[u] = load_vec<T, VEC>(p.dy + (m + u * stride) * C + c0);
        v[u] = load_vec<T, VEC>(p.x + (m + u * stride) * C + c0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (m + u * stride < M) {
        Vec<T, VEC> o;
#pragma unroll
        for (int i = 0; i < VEC; ++i)
          o.val[i] = none ? T(0) : T(a[i] * (acc_t(g[u].val[i]) - mdy[i] - (acc_t(v[u].val[i]) - mu[i]) * k[i]));
        store_vec<T, VEC>(p.dx + (m + u * stride) * C + c0, o);
      }
    }
  }
}

template <typename T, typename P, int VEC>
void launch_backward_elemt(const BackwardArgs<T, P, at::opmath_type<T>>& p, const Layout& l, int device) {
  const int64_t resident =
      l.channels_last ? resident_blocks(device, backward_elemt_channels_last_kernel<T, P, VEC>, kThreads)
                      : resident_blocks(device, backward_elemt_channels_first_kernel<T, P, VEC>, kThreads);
  // Two waves' worth of blocks, as for elemt.
  const Geometry geo = geometry(l, VEC, 2 * resident);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (l.channels_last)
    SYNCBN_LAUNCH(geo.grid, geo.block, 0, stream, backward_elemt_channels_last_kernel<T, P, VEC>)(p, l.rows(), l.c, geo.splits);
  else
    SYNCBN_LAUNCH(geo.grid, geo.block, 0, stream, backward_elemt_channels_first_kernel<T, P, VEC>)(p, l.n, l.c, l.s, geo.splits, geo.s_splits, geo.chunk);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace detail

at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input,
                                     const at::Tensor& mean, const at::Tensor& invstd,
                                     const std::optional<at::Tensor>& weight,
                                     const at::Tensor& reduced, const at::Tensor& count) {
  using namespace detail;
  constexpr const char* kOp = "batch_norm_backward_elemt";
  const Layout l = check_input(input, kOp);
  checks::like_input(grad_out, input, l.format, kOp, "grad_out");
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor& x = input;
  const at::Tensor& dy = grad_out;
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor mean_a = channel_vector(mean, x, acc, kOp, "mean");
  const at::Tensor invstd_a = channel_vector(invstd, x, acc, kOp, "invstd");
  checks::vector(reduced, 2 * l.c, x.device(), kOp, "reduced", "[sum_dy, sum_dy_xhat] per channel");
  const Affine affine = prepare_affine(weight, std::nullopt, x, acc, kOp);
  checks::count(count, x.device(), kOp);
  at::Tensor dx = empty_like_input(x, l);
  if (x.numel() == 0) return dx;
  const at::Tensor reduced_a = reduced.to(acc).contiguous();
  const at::Tensor count_d = count.to(at::kDouble).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_batch_norm_backward_elemt_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    dispatch_param_type<scalar_t, acc_t>(affine.native, [&](auto tag) {
      using P = typename decltype(tag)::type;
      const BackwardArgs<scalar_t, P, acc_t> p{dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
                                               dx.data_ptr<scalar_t>(), mean_a.const_data_ptr<acc_t>(),
                                               invstd_a.const_data_ptr<acc_t>(), ptr_or_null<P>(affine.weight),
                                               reduced_a.const_data_ptr<acc_t>(), count_d.const_data_ptr<double>()};
      constexpr int kVec = kVecBytes / sizeof(scalar_t);
      if (can_vectorize(l, kVec, {dy.const_data_ptr(), x.const_data_ptr(), dx.const_data_ptr()}))
        launch_backward_elemt<scalar_t, P, kVec>(p, l, x.get_device());
      else
        launch_backward_elemt<scalar_t, P, 1>(p, l, x.get_device());
    });
  });
  return dx;
}

void backward_elemt_occupancy(std::vector<KernelOccupancy>& out) {
  using namespace detail;
  add_occupancy(out, "backward_elemt_channels_first<float,4>", backward_elemt_channels_first_kernel<float, float, 4>,
                kThreads);
  add_occupancy(out, "backward_elemt_channels_first<bfloat16,8>",
                backward_elemt_channels_first_kernel<at::BFloat16, float, 8>, kThreads);
  add_occupancy(out, "backward_elemt_channels_last<float,4>", backward_elemt_channels_last_kernel<float, float, 4>,
                kThreads);
  add_occupancy(out, "backward_elemt_channels_last<bfloat16,8>",
                backward_elemt_channels_last_kernel<at::BFloat16, float, 8>, kThreads);
}

}  // namespace syncbn::cuda
