// Host-side helpers shared by the SyncBN CUDA ops: argument checks, the two memory layouts the kernels
// walk, launch geometry and the per-dtype vector width. No function here synchronises with the device.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>

#include "../checks.h"
#include "reduce.cuh"

namespace syncbn::cuda::detail {

// The kernels see x either as channels-first (N rows of C planes of S contiguous values: contiguous
// NCHW/NCDHW/NCL) or channels-last (M = N*S rows of C contiguous channels: channels_last,
// channels_last_3d, plain (N, C) and S == 1).
struct Layout {
  bool channels_last;
  at::MemoryFormat format;  // the format x is contiguous in (grad_out must share it)
  int64_t n;                // batch size N
  int64_t c;                // channels C
  int64_t s;                // spatial size S = prod(sizes[2:]) (1 for 2-D input)
  int64_t rows() const { return n * s; }
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Checks x like every backend does (csrc/checks.h) and classifies its layout. Other strides are the
// caller's to densify (SyncBatchNorm does, in the format PyTorch suggests): a hidden copy here would
// cost a pass over memory the caller cannot see.
inline Layout check_input(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.defined(), op, ": input is undefined");
  TORCH_CHECK(simt::is_device_tensor(x), op, ": expected a CUDA input tensor, got one on ", x.device());
  Layout l;
  l.format = checks::input_format(x, op);
  l.n = x.size(0);
  l.c = x.size(1);
  l.s = 1;
  for (int64_t d = 2; d < x.dim(); ++d) l.s *= x.size(d);
  // S == 1 ((N, C) or (N, C, 1, 1)): channels-last is the coalesced walk, and both layouts coincide.
  l.channels_last = l.format != at::MemoryFormat::Contiguous || l.s == 1;
  return l;
}

// A checked per-channel vector of C values, as a contiguous tensor of `dtype` (converted only when needed).
inline at::Tensor channel_vector(const at::Tensor& v, const at::Tensor& x, at::ScalarType dtype, const char* op,
                                 const char* name) {
  checks::vector(v, x.size(1), x.device(), op, name, "one per channel");
  return v.to(dtype).contiguous();
}

// Output in x's layout, with x's exact strides where they are dense (so channels_last stays channels_last
// even where the format is ambiguous: C == 1, H == W == 1, empty), as the CPU backend allocates it.
inline at::Tensor empty_like_input(const at::Tensor& x, const Layout& l) {
  at::Tensor out = at::empty_like(x);
  if (!out.is_contiguous(l.format)) out = at::empty_like(x, l.format);
  return out;
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

// Blocks that fit on the device at once for one kernel: SMs x its resident blocks per SM. Kept apart
// from the queries so the geometry below stays a function of (shape, resident blocks) alone.
inline int64_t resident_blocks_from(int sms, int blocks_per_sm) {
  // A kernel that fits no block (it would fail to launch) still gets a one-block-per-SM target.
  return int64_t(std::max(sms, 1)) * std::max(blocks_per_sm, 1);
}

// Blocks of `kernel` (the very instantiation launched) that fit on `device` at once, for blocks of
// `threads` threads with `smem` bytes of dynamic shared memory: SMs x
// cudaOccupancyMaxActiveBlocksPerMultiprocessor, which counts the kernel's registers and shared memory
// (ptxas gives the 16-bit stats kernels ~100 registers per thread: 2 blocks of 256 threads per SM on
// sm_90, not the 8 the thread slots allow). Needs `device` current (the ops hold a CUDAGuard). Cached
// per (device, kernel, threads, smem): the queries are cheap but not free, and never synchronise. An
// emulated device (device < 0: CPU tensors) may change between launches, so it is asked every time.
template <typename Kernel>
inline int64_t resident_blocks(int device, Kernel kernel, int threads, size_t smem = 0) {
  using Key = std::tuple<int, const void*, int, size_t>;
  static std::mutex mutex;
  static std::map<Key, int64_t> cache;
  const Key key{device, reinterpret_cast<const void*>(kernel), threads, smem};
  if (device >= 0) {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  int sms = 0, per_sm = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  const int64_t blocks = resident_blocks_from(sms, per_sm);
  if (device >= 0) {
    std::lock_guard<std::mutex> lock(mutex);
    cache.emplace(key, blocks);
  }
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
  if (a.weight.defined()) checks::vector(a.weight, x.size(1), x.device(), op, "weight", "one per channel");
  if (a.bias.defined()) checks::vector(a.bias, x.size(1), x.device(), op, "bias", "one per channel");
  for (const at::Tensor* t : {&a.weight, &a.bias})
    if (t->defined() && t->scalar_type() != x.scalar_type()) a.native = false;
  const auto dtype = a.native ? x.scalar_type() : acc;
  if (a.weight.defined()) a.weight = a.weight.to(dtype).contiguous();
  if (a.bias.defined()) a.bias = a.bias.to(dtype).contiguous();
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
