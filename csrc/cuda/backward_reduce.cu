// batch_norm_backward_reduce: per-channel sum(dy) and sum(dy * xhat) in one read of x and dy, packed as
// [sum_dy(C), sum_dy_xhat(C)] in the accumulation type for a single all_reduce. Threads accumulate in
// fp32 (fp64 for fp64 input), blocks reduce with warp shuffles then shared memory, and channels split
// across blocks are summed in float64 by a second tiny kernel (deterministic: no atomics).
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

template <typename T>
struct ReduceArgs {
  SYNCBN_PTR(const T) dy;
  SYNCBN_PTR(const T) x;
  SYNCBN_PTR(const at::opmath_type<T>) mean;
  SYNCBN_PTR(const at::opmath_type<T>) invstd;
  SYNCBN_PTR(at::opmath_type<T>) out;  // [2C]
  SYNCBN_PTR(double) partial;          // [2][C][splits] when splits > 1
};

// sum(dy * xhat) = invstd * sum(dy * (x - mean)): the kernels sum dy * (x - mean) and scale once.
template <typename T>
__device__ __forceinline__ void store_channel(const ReduceArgs<T>& a, int64_t C, int splits, int64_t c, int64_t g,
                                              at::opmath_type<T> sum_dy, at::opmath_type<T> sum_dy_xmu) {
#if defined(SYNCTRAIN_SELFCHECK_FAULT)
  // Only in the deliberately faulty emulated variant (extension.make_emulated_spec(fault=True)): one wrong
  // result, channel 0's sum(dy * xhat) doubled, which the self-check (src/syncbn/selfcheck.py) must catch.
  if (c == 0) sum_dy_xmu *= 2;
#endif
  if (splits == 1) {
    a.out[c] = sum_dy;
    a.out[C + c] = sum_dy_xmu * a.invstd[c];
  } else {
    a.partial[c * splits + g] = double(sum_dy);
    a.partial[(C + c) * splits + g] = double(sum_dy_xmu);
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    backward_reduce_channels_first_kernel(ReduceArgs<T> a, int64_t N, int64_t C, int64_t S, int splits, int s_splits, int64_t chunk) {
  using acc_t = at::opmath_type<T>;
  const int bx = blockDim.x;
  const int64_t c = blockIdx.x;
  const int64_t sv = S / VEC;
  const acc_t mu = a.mean[c];
  SumPair<acc_t, 1> st;
  st.reset();
  const PlaneRange r = plane_range(sv, splits, s_splits, chunk);
  for (int64_t n = r.n0; n < N; n += r.n_step) {
    const int64_t plane = (n * C + c) * S;
    for (int64_t s = r.s0; s < r.s1; s += int64_t(kUnroll) * bx) {
      Vec<T, VEC> g[kUnroll], v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (s + u * bx < r.s1) {
          g[u] = load_vec<T, VEC>(a.dy + plane + (s + u * bx) * VEC);
          v[u] = load_vec<T, VEC>(a.x + plane + (s + u * bx) * VEC);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (s + u * bx < r.s1) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            const acc_t dy = acc_t(g[u].val[i]);
            st.a[0] += dy;
            st.b[0] += dy * (acc_t(v[u].val[i]) - mu);
          }
        }
      }
    }
  }
  st = block_reduce(st, 1);
  if (threadIdx.x == 0 && threadIdx.y == 0) store_channel(a, C, splits, c, blockIdx.y, st.a[0], st.b[0]);
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    backward_reduce_channels_last_kernel(ReduceArgs<T> a, int64_t M, int64_t C, int splits) {
  using acc_t = at::opmath_type<T>;
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  const bool active = c0 < C;
  const int64_t stride = int64_t(splits) * blockDim.y;
  SumPair<acc_t, VEC> st;
  st.reset();
  if (active) {
    acc_t mu[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) mu[i] = a.mean[c0 + i];
    for (int64_t m = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; m < M; m += kUnroll * stride) {
      Vec<T, VEC> g[kUnroll], v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (m + u * stride < M) {
          g[u] = load_vec<T, VEC>(a.dy + (m + u * stride) * C + c0);
          v[u] = load_vec<T, VEC>(a.x + (m + u * stride) * C + c0);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (m + u * stride < M) {
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            const acc_t dy = acc_t(g[u].val[i]);
            st.a[i] += dy;
            st.b[i] += dy * (acc_t(v[u].val[i]) - mu[i]);
          }
        }
      }
    }
  }
  // Inactive threads (channels past C) still join the reduction: it has a barrier.
  st = block_reduce(st, blockDim.x);
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) store_channel(a, C, splits, c0 + i, blockIdx.y, st.a[i], st.b[i]);
  }
}

// One warp per channel sums the `splits` float64 partials.
template <typename acc_t>
__global__ void backward_reduce_finalize_kernel(SYNCBN_PTR(const double) partial, int64_t C, int splits,
                                                SYNCBN_PTR(const acc_t) invstd, SYNCBN_PTR(acc_t) out) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  if (c >= C) return;  // the whole warp shares c
  SumPair<double, 1> st;
  st.reset();
  for (int g = threadIdx.x; g < splits; g += 32) {
    st.a[0] += partial[c * splits + g];
    st.b[0] += partial[(C + c) * splits + g];
  }
  for (int off = 1; off < 32; off <<= 1) st.merge(st.shfl_xor(off));
  if (threadIdx.x == 0) {
    out[c] = acc_t(st.a[0]);
    out[C + c] = acc_t(st.b[0] * double(invstd[c]));
  }
}

template <typename T, int VEC>
void launch_backward_reduce(ReduceArgs<T> args, const Layout& l, int device, const at::Tensor& like) {
  using acc_t = at::opmath_type<T>;
  const int64_t resident =
      l.channels_last ? resident_blocks(device, backward_reduce_channels_last_kernel<T, VEC>, kThreads)
                      : resident_blocks(device, backward_reduce_channels_first_kernel<T, VEC>, kThreads);
  const Geometry geo = geometry(l, VEC, resident);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor partial;
  if (geo.splits > 1) {
    partial = at::empty({2 * l.c * geo.splits}, like.options().dtype(at::kDouble));
    args.partial = partial.data_ptr<double>();
  }
  if (l.channels_last)
    SYNCBN_LAUNCH(geo.grid, geo.block, 0, stream, backward_reduce_channels_last_kernel<T, VEC>)(args, l.rows(), l.c, geo.splits);
  else
    SYNCBN_LAUNCH(geo.grid, geo.block, 0, stream, backward_reduce_channels_first_kernel<T, VEC>)(args, l.n, l.c, l.s, geo.splits, geo.s_splits, geo.chunk);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (geo.splits > 1) {
    const dim3 block(32, kFinalizeWarps);
    const dim3 grid(unsigned(ceil_div(l.c, kFinalizeWarps)));
    SYNCBN_LAUNCH(grid, block, 0, stream, backward_reduce_finalize_kernel<acc_t>)(args.partial, l.c, geo.splits, args.invstd, args.out);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

}  // namespace
}  // namespace detail

at::Tensor batch_norm_backward_reduce(const at::Tensor& grad_out, const at::Tensor& input,
                                      const at::Tensor& mean, const at::Tensor& invstd) {
  using namespace detail;
  constexpr const char* kOp = "batch_norm_backward_reduce";
  const Layout l = check_input(input, kOp);
  checks::like_input(grad_out, input, l.format, kOp, "grad_out");
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor& x = input;
  const at::Tensor& dy = grad_out;
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor mean_a = channel_vector(mean, x, acc, kOp, "mean");
  const at::Tensor invstd_a = channel_vector(invstd, x, acc, kOp, "invstd");
  const auto opts = x.options().dtype(acc).memory_format(at::MemoryFormat::Contiguous);
  if (x.numel() == 0) return at::zeros({2 * l.c}, opts);
  at::Tensor out = at::empty({2 * l.c}, opts);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "syncbn_batch_norm_backward_reduce_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const ReduceArgs<scalar_t> args{dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
                                    mean_a.const_data_ptr<acc_t>(), invstd_a.const_data_ptr<acc_t>(),
                                    out.data_ptr<acc_t>(), nullptr};
    constexpr int kVec = kVecBytes / sizeof(scalar_t);
    if (can_vectorize(l, kVec, {dy.const_data_ptr(), x.const_data_ptr()}))
      launch_backward_reduce<scalar_t, kVec>(args, l, x.get_device(), x);
    else
      launch_backward_reduce<scalar_t, 1>(args, l, x.get_device(), x);
  });
  return out;
}

void backward_reduce_occupancy(std::vector<KernelOccupancy>& out) {
  using namespace detail;
  add_occupancy(out, "backward_reduce_channels_first<float,4>", backward_reduce_channels_first_kernel<float, 4>, kThreads);
  add_occupancy(out, "backward_reduce_channels_first<bfloat16,8>",
                backward_reduce_channels_first_kernel<at::BFloat16, 8>, kThreads);
  add_occupancy(out, "backward_reduce_channels_last<float,4>", backward_reduce_channels_last_kernel<float, 4>, kThreads);
  add_occupancy(out, "backward_reduce_channels_last<bfloat16,8>",
                backward_reduce_channels_last_kernel<at::BFloat16, 8>, kThreads);
  add_occupancy(out, "backward_reduce_finalize<float>", backward_reduce_finalize_kernel<float>, 32 * kFinalizeWarps);
}

}  // namespace syncbn::cuda
