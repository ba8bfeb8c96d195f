// Host-side helpers shared by the SyncBN CUDA ops: argument checks, the two memory layouts the kernels
// walk, launch geometry and the per-dtype vector width. No function here synchronises with the device.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "reduce.cuh"

namespace syncbn::cuda::detail {

// The kernels see x either as channels-first (N rows of C planes of S contiguous values: contiguous
// NCHW/NCDHW/NCL) or channels-last (M = N*S rows of C contiguous channels: channels_last,
// channels_last_3d, a (N, L, C) tensor transposed to (N, C, L), and plain (N, C)).
struct Layout {
  bool channels_last;
  int64_t n;  // batch size N
  int64_t c;  // channels C
  int64_t s;  // spatial size S = prod(sizes[2:]) (1 for 2-D input)
  int64_t rows() const { return n * s; }
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// True when t's memory is [N, spatial..., C] dense (channels innermost), ignoring strides of size-1 dims.
inline bool is_channels_last_dense(const at::Tensor& t) {
  if (t.dim() < 2) return false;
  int64_t expected = 1;
  if (t.size(1) != 1 && t.stride(1) != expected) return false;
  expected = t.size(1);
  for (int64_t d = t.dim() - 1; d >= 2; --d) {
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return t.size(0) == 1 || t.stride(0) == expected;
}

inline void check_input(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.defined() && simt::is_device_tensor(x), op, ": expected a CUDA input tensor, got ",
              x.defined() ? x.device().str() : "an undefined tensor");
  TORCH_CHECK(x.dim() >= 2, op, ": expected input of shape (N, C, *) with at least 2 dims, got ", x.sizes());
  const auto t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16, op,
              ": supports float32, float64, float16 and bfloat16 input, got ", t);
}

// x itself when the kernels can walk it directly, else one dense copy in its suggested memory format.
inline at::Tensor dense_input(const at::Tensor& x) {
  if (x.is_contiguous() || is_channels_last_dense(x)) return x;
  return x.contiguous(x.suggest_memory_format());
}

inline Layout layout_of(const at::Tensor& x) {
  Layout l;
  l.n = x.size(0);
  l.c = x.size(1);
  l.s = 1;
  for (int64_t d = 2; d < x.dim(); ++d) l.s *= x.size(d);
  // S == 1 ((N, C) or (N, C, 1, 1)): channels-last is the coalesced walk, and both layouts coincide.
  l.channels_last = !(x.is_contiguous() && l.s != 1);
  TORCH_INTERNAL_ASSERT(!l.channels_last || is_channels_last_dense(x), "syncbn: input is not dense");
  return l;
}

// `t` (same shape as x) with x's element order, copying only when its strides differ (e.g. a contiguous
// grad_output for a channels_last input).
inline at::Tensor like_layout(const at::Tensor& t, const at::Tensor& x, const Layout& l, const char* what) {
  TORCH_CHECK(t.defined() && t.sizes() == x.sizes(), what, " must have the input's shape ", x.sizes(),
              ", got ", t.defined() ? t.sizes() : at::IntArrayRef{});
  TORCH_CHECK(t.device() == x.device(), what, " must be on ", x.device(), ", got ", t.device());
  if (l.channels_last ? is_channels_last_dense(t) : t.is_contiguous()) return t;
  // empty_like keeps x's strides (x is dense), so the copy is laid out exactly like x.
  return at::empty_like(x, t.options()).copy_(t);
}

// A per-channel [C] vector on x's device in dtype `dtype` (converted only when needed).
inline at::Tensor channel_vector(const at::Tensor& v, const at::Tensor& x, at::ScalarType dtype, const char* what) {
  TORCH_CHECK(v.defined() && v.numel() == x.size(1), what, " must have one value per channel (", x.size(1),
              "), got shape ", v.defined() ? v.sizes() : at::IntArrayRef{});
  TORCH_CHECK(v.device() == x.device(), what, " must be on ", x.device(), ", got ", v.device());
  return v.to(dtype).contiguous().view({-1});
}

inline bool present(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

inline bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kVecBytes == 0; }

// Vector accesses need every base pointer 16-byte aligned and the contiguous extent (S for
// channels-first, C for channels-last) a multiple of the vector width, so no vector straddles a plane.
inline bool can_vectorize(const Layout& l, int vec, std::initializer_list<const void*> ptrs) {
  const int64_t inner = l.channels_last ? l.c : l.s;
  if (inner % vec != 0) return false;
  for (const void* p : ptrs)
    if (!aligned(p)) return false;
  return true;
}

// Blocks that fit on the device at once (SMs x blocks of kThreads per SM), cached per device: the
// attribute query is cheap but not free, and it never synchronises.
inline int64_t resident_blocks(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int64_t> cache[kMaxDevices];
  if (device >= 0 && device < kMaxDevices) {
    const int64_t hit = cache[device].load(std::memory_order_relaxed);
    if (hit > 0) return hit;
  }
  int sms = 0, threads = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  const int64_t blocks = int64_t(std::max(sms, 1)) * std::max(threads / kThreads, 1);
  if (device >= 0 && device < kMaxDevices) cache[device].store(blocks, std::memory_order_relaxed);
  return blocks;
}

// grid.y (the split of the rows between blocks) is limited to 65535 by CUDA; the loops grid-stride.
constexpr int64_t kMaxSplits = 65535;

struct Geometry {
  dim3 grid;
  dim3 block;
  int splits;        // == grid.y: blocks per channel (group of channels)
  int s_splits = 1;  // channels-first: of those, how many split each plane (S); divides splits
  int64_t chunk = 0; // channels-first: vectors of a plane per s-split
};

// Channels-first: one channel per blockIdx.x; a block is bx x by threads over (vectors of a plane, planes
// n), bx sized so each thread gets ~kUnroll vectors of a plane per row (at least 8 threads = 128
// contiguous bytes per row segment). blockIdx.y splits the N planes and, when that is not enough blocks
// (small N, large S: segmentation batches), each plane into chunks, so that about `target` blocks run.
inline Geometry channels_first_geometry(const Layout& l, int vec, int64_t target) {
  const int64_t sv = ceil_div(l.s, vec);
  // No more thread rows than planes: with a small batch the threads go along the plane instead.
  const int64_t min_bx = kThreads / std::min<int64_t>(next_pow2(l.n), kThreads);
  const int bx = int(std::clamp<int64_t>(std::max(next_pow2(ceil_div(sv, kUnroll)), min_bx), 8, kThreads));
  const int by = kThreads / bx;
  const int64_t n_splits = std::clamp<int64_t>(ceil_div(target, l.c), 1, std::min(ceil_div(l.n, by), kMaxSplits));
  int64_t s_splits = 1;
  const int64_t step = int64_t(bx) * kUnroll;  // vectors one unrolled block iteration covers
  if (l.c * n_splits < target)
    s_splits = std::clamp<int64_t>(ceil_div(target, l.c * n_splits), 1, ceil_div(sv, step));
  s_splits = std::min(s_splits, kMaxSplits / n_splits);
  // Chunks are whole unrolled iterations; recount the splits after rounding so none is empty.
  const int64_t chunk = ceil_div(ceil_div(sv, s_splits), step) * step;
  s_splits = ceil_div(sv, chunk);
  const int64_t splits = n_splits * s_splits;
  return {dim3(unsigned(l.c), unsigned(splits)), dim3(bx, by), int(splits), int(s_splits), chunk};
}

// Channels-last: a thread owns `vec` adjacent channels; bx (<= 32) threads cover a row's channels, by rows
// per block; blockIdx.x walks channel groups, blockIdx.y splits the M rows. A warp reads whole rows (or
// 32 x 16 bytes of one), so every access is coalesced. About `target` blocks, but never more than one
// row per thread (large tensors get many rows per thread, so the unrolled loads stay full).
inline Geometry channels_last_geometry(const Layout& l, int vec, int64_t target) {
  const int64_t cv = ceil_div(l.c, vec);
  const int bx = int(std::min<int64_t>(next_pow2(cv), 32));
  const int by = kThreads / bx;
  const int64_t gx = ceil_div(cv, bx);
  const int64_t splits = std::clamp<int64_t>(std::min(ceil_div(target, gx), ceil_div(l.rows(), by)), 1, kMaxSplits);
  return {dim3(unsigned(gx), unsigned(splits)), dim3(bx, by), int(splits)};
}

inline Geometry geometry(const Layout& l, int vec, int64_t target) {
  return l.channels_last ? channels_last_geometry(l, vec, target) : channels_first_geometry(l, vec, target);
}

// Per-channel affine parameters as the elementwise kernels read them: in the input's own dtype when both
// given ones already have it (no conversion launch), else converted to the accumulation type (e.g. fp32
// parameters with bf16 activations, the AMP case, cost no conversion either).
struct Affine {
  at::Tensor weight;  // undefined when absent
  at::Tensor bias;
  bool native;        // true: dtype == input dtype; false: accumulation dtype
};

inline Affine prepare_affine(const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                             const at::Tensor& x, at::ScalarType acc, const char* op) {
  Affine a{present(weight) ? *weight : at::Tensor(), present(bias) ? *bias : at::Tensor(), true};
  for (const at::Tensor* t : {&a.weight, &a.bias})
    if (t->defined() && t->scalar_type() != x.scalar_type()) a.native = false;
  const auto dtype = a.native ? x.scalar_type() : acc;
  if (a.weight.defined()) a.weight = channel_vector(a.weight, x, dtype, (std::string(op) + ": weight").c_str());
  if (a.bias.defined()) a.bias = channel_vector(a.bias, x, dtype, (std::string(op) + ": bias").c_str());
  return a;
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<P>{}) with P the parameter type chosen by prepare_affine. For float and double inputs
// the two choices are the same type, so only one kernel is instantiated.
template <typename scalar_t, typename acc_t, typename F>
inline void dispatch_param_type(bool native, F&& f) {
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    f(TypeTag<acc_t>{});
  } else {
    if (native)
      f(TypeTag<scalar_t>{});
    else
      f(TypeTag<acc_t>{});
  }
}

template <typename P>
inline const P* ptr_or_null(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<P>() : nullptr;
}

// Finalize kernels: one warp per channel, 8 channels per block.
constexpr int kFinalizeWarps = 8;

}  // namespace syncbn::cuda::detail
