// batch_norm_elemt: y = (x - mean) * invstd * weight + bias in one read of x and one write of y, with
// 16-byte vector accesses where the layout allows. y keeps x's dtype and memory format.
//
// (x - mean) is formed before scaling (not x * scale + shift): with |mean| >> std the folded form
// cancels two large products and loses the low bits of y.
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
struct ElemtArgs {
  SYNCBN_PTR(const T) x;
  SYNCBN_PTR(T) y;
  SYNCBN_PTR(const P) weight;  // nullptr: 1
  SYNCBN_PTR(const P) bias;    // nullptr: 0
  SYNCBN_PTR(const acc_t) mean;
  SYNCBN_PTR(const acc_t) invstd;
};

template <typename P, typename acc_t>
__device__ __forceinline__ void channel_affine(SYNCBN_PTR(const P) weight, SYNCBN_PTR(const P) bias, SYNCBN_PTR(const acc_t) mean,
                                               SYNCBN_PTR(const acc_t) invstd, int64_t c, acc_t& mu, acc_t& scale,
                                               acc_t& shift) {
  mu = mean[c];
  scale = invstd[c] * (weight != nullptr ? acc_t(weight[c]) : acc_t(1));
  shift = bias != nullptr ? acc_t(bias[c]) : acc_t(0);
}

template <typename T, typename P, int VEC>
__global__ void __launch_bounds__(kThreads)
    elemt_channels_first_kernel(ElemtArgs<T, P, at::opmath_type<T>> a, int64_t N, int64_t C, int64_t S, int splits, int s_splits, int64_t chunk) {
  using acc_t = at::opmath_type<T>;
  const int bx = blockDim.x;
  const int64_t c = blockIdx.x;
  const int64_t sv = S / VEC;
  acc_t mu, scale, shift;
  channel_affine(a.weight, a.bias, a.mean, a.invstd, c, mu, scale, shift);
  const PlaneRange r = plane_range(sv, splits, s_splits, chunk);
  for (int64_t n = r.n0; n < N; n += r.n_step) {
    const int64_t plane = (n * C + c) * S;
    for (int64_t s = r.s0; s < r.s1; s += int64_t(kUnroll) * bx) {
      Vec<T, VEC> v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (s + u * bx < r.s1) v[u] = load_vec<T, VEC>(a.x + plane + (s + u * bx) * VEC);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (s + u * bx < r.s1) {
          Vec<T, VEC> o;
#pragma unroll
          for (int i = 0; i < VEC; ++i) o.val[i] = T((acc_t(v[u].val[i]) - mu) * scale + shift);
          store_vec<T, VEC>(a.y + plane + (s + u * bx) * VEC, o);
        }
      }
    }
  }
}

template <typename T, typename P, int VEC>
__global__ void __launch_bounds__(kThreads)
    elemt_channels_last_kernel(ElemtArgs<T, P, at::opmath_type<T>> a, int64_t M, int64_t C, int splits) {
  using acc_t = at::opmath_type<T>;
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  if (c0 >= C) return;  // no barrier in this kernel
  acc_t mu[VEC], scale[VEC], shift[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) channel_affine(a.weight, a.bias, a.mean, a.invstd, c0 + i, mu[i], scale[i], shift[i]);
  const int64_t stride = int64_t(splits) * blockDim.y;
  for (int64_t m = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; m < M; m += kUnroll * stride) {
    Vec<T, VEC> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (m + u * stride < M) v[u] = load_vec<T, VEC>(a.x + (m + u * stride) * C + c0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (m + u * stride < M) {
        Vec<T, VEC> o;
#pragma unroll
        for (int i = 0; i < VEC; ++i) o.val[i] = T((acc_t(v[u].val[i]) - mu[i]) * scale[i] + shift[i]);
        store_vec<T, VEC>(a.y + (m + u * stride) * C + c0, o);
      }
    }
  }
}

template <typename T, typename P, int VEC>
void launch_elemt(const ElemtArgs<T, P, at::opmath_type<T>>& args, const Layout& l, int device) {
  // Elementwise: two waves' worth of blocks keeps every SM busy through the tail of the grid-stride loop.
  const int64_t resident = l.channels_last ? resident_blocks(device, elemt_channels_last_kernel<T, P, VEC>, kThreads)
                                           : resident_blocks(device, elemt_channels_first_kernel<T, P, VEC>, kThreads);
  const Geometry geo = geometry(l, VEC, 2 * resident);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (l.channels_last)
    SYNCBN_LAUNCH(geo.grid, geo.block, 0, stream, elemt_channels_last_kernel<T, P, VEC>)(args, l.rows(), l.c, geo.splits);
  else
    SYNCBN_LAUNCH(geo.grid, geo.block, 0, stream, elemt_channels_first_kernel<T, P, VEC>)(args, l.n, l.c, l.s, geo.splits, geo.s_splits, geo.chunk);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace detail

at::Tensor batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                            const at::Tensor& invstd) {
  using namespace detail;
  constexpr const char* kOp = "batch_norm_elemt";
  const Layout l = check_input(input, kOp);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor& x = input;
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor mean_a = channel_vector(mean, x, acc, kOp, "mean");
  const at::Tensor invstd_a = channel_vector(invstd, x, acc, kOp, "invstd");
  const Affine affine = prepare_affine(weight, bias, x, acc, kOp);
  at::Tensor y = empty_like_input(x, l);
  if (x.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_batch_norm_elemt_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    dispatch_param_type<scalar_t, acc_t>(affine.native, [&](auto tag) {
      using P = typename decltype(tag)::type;
      const ElemtArgs<scalar_t, P, acc_t> args{x.const_data_ptr<scalar_t>(), y.data_ptr<scalar_t>(),
                                               ptr_or_null<P>(affine.weight), ptr_or_null<P>(affine.bias),
                                               mean_a.const_data_ptr<acc_t>(), invstd_a.const_data_ptr<acc_t>()};
      constexpr int kVec = kVecBytes / sizeof(scalar_t);
      if (can_vectorize(l, kVec, {x.const_data_ptr(), y.const_data_ptr()}))
        launch_elemt<scalar_t, P, kVec>(args, l, x.get_device());
      else
        launch_elemt<scalar_t, P, 1>(args, l, x.get_device());
    });
  });
  return y;
}

void elemt_occupancy(std::vector<KernelOccupancy>& out) {
  using namespace detail;
  add_occupancy(out, "elemt_channels_first<float,4>", elemt_channels_first_kernel<float, float, 4>, kThreads);
  add_occupancy(out, "elemt_channels_first<bfloat16,8>", elemt_channels_first_kernel<at::BFloat16, float, 8>, kThreads);
  add_occupancy(out, "elemt_channels_last<float,4>", elemt_channels_last_kernel<float, float, 4>, kThreads);
  add_occupancy(out, "elemt_channels_last<bfloat16,8>", elemt_channels_last_kernel<at::BFloat16, float, 8>, kThreads);
}

}  // namespace syncbn::cuda
