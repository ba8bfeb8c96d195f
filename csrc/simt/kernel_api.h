// The device-side CUDA surface, emulated: the qualifiers, threadIdx / blockIdx / blockDim / gridDim,
// warpSize, __syncthreads (a real barrier among the block's threads), __syncwarp and the four warp
// shuffles (32-lane semantics with masks and widths, as PTX's shfl.sync defines them), atomicAdd,
// static __shared__ (one copy per OS thread running the block: blocks run one at a time per thread; not
// bounds-checked, ptxas sizes it; poisoned per block: a byte a block reads before writing it reads
// 0xFF) and dynamic shared memory (dynamic_shared<T>(), bounds-checked and poisoned per block). Both
// kinds of shared memory, and global memory writes, go through the race detector (race.h).
// __launch_bounds__ is accepted and ignored (register limits are ptxas' to enforce).
//
// Every synchronisation records where it was called from (std::source_location), so a barrier or
// shuffle that threads reach from different places, or that a thread skips by returning early, is a
// reported fault instead of undefined behaviour.
#pragma once
#include <cstdint>
#include <cstring>
#include <source_location>
#include <type_traits>

#include "checked_ptr.h"
#include "runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local

constexpr int warpSize = 32;

namespace syncbn::simt {

// What device code sees of the running thread.
struct ThreadView {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
  void* executor;  // the emulator running it (executor.cpp), so synchronisation needs no TLS lookup
};

namespace detail {
extern thread_local ThreadView* tls_view;  // set by the scheduler while an emulated thread runs
[[noreturn]] void outside_kernel(const char* what);
inline const ThreadView& view(const char* what) {
  const ThreadView* v = tls_view;
  if (v == nullptr) [[unlikely]]
    outside_kernel(what);
  return *v;
}

enum class ShuffleMode { kIdx, kUp, kDown, kXor };
void syncthreads(const std::source_location& loc);
void syncwarp(unsigned mask, const std::source_location& loc);
// Exchanges 8 bytes per lane among the lanes of `mask`; returns the bytes of the source lane.
uint64_t shuffle(ShuffleMode mode, unsigned mask, uint64_t value, int lane_arg, int width,
                 const std::source_location& loc);
void* dynamic_shared_base(size_t* bytes);
}  // namespace detail

template <typename T>
inline Ptr<T> dynamic_shared() {
  size_t bytes = 0;
  char* base = static_cast<char*>(detail::dynamic_shared_base(&bytes));
  return Ptr<T>(reinterpret_cast<T*>(base), base, base + bytes);
}

}  // namespace syncbn::simt

#define threadIdx (::syncbn::simt::detail::view("threadIdx").thread_idx)
#define blockIdx (::syncbn::simt::detail::view("blockIdx").block_idx)
#define blockDim (::syncbn::simt::detail::view("blockDim").block_dim)
#define gridDim (::syncbn::simt::detail::view("gridDim").grid_dim)

inline void __syncthreads(const std::source_location& loc = std::source_location::current()) {
  ::syncbn::simt::detail::syncthreads(loc);
}

inline void __syncwarp(unsigned mask = 0xffffffffu,
                       const std::source_location& loc = std::source_location::current()) {
  ::syncbn::simt::detail::syncwarp(mask, loc);
}

namespace syncbn::simt::detail {
template <typename T>
inline T shuffle_as(ShuffleMode mode, unsigned mask, T var, int lane_arg, int width,
                    const std::source_location& loc) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "warp shuffles move 4- or 8-byte values");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = shuffle(mode, mask, bits, lane_arg, width, loc);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
}  // namespace syncbn::simt::detail

template <typename T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize,
                     const std::source_location& loc = std::source_location::current()) {
  return ::syncbn::simt::detail::shuffle_as(::syncbn::simt::detail::ShuffleMode::kIdx, mask, var, src_lane, width, loc);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                        const std::source_location& loc = std::source_location::current()) {
  return ::syncbn::simt::detail::shuffle_as(::syncbn::simt::detail::ShuffleMode::kUp, mask, var, int(delta), width, loc);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                          const std::source_location& loc = std::source_location::current()) {
  return ::syncbn::simt::detail::shuffle_as(::syncbn::simt::detail::ShuffleMode::kDown, mask, var, int(delta), width, loc);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                         const std::source_location& loc = std::source_location::current()) {
  return ::syncbn::simt::detail::shuffle_as(::syncbn::simt::detail::ShuffleMode::kXor, mask, var, lane_mask, width, loc);
}

// Emulated threads switch only at barriers and shuffles, so a read-modify-write is atomic among them
// (each OS thread runs its own launches). `address` comes from a checked access (&p[i]). Not
// instrumented (and so never inlined into instrumented code): atomics are not races.
template <typename T>
__attribute__((noinline, no_sanitize("thread"))) T atomicAdd(T* address, T val) {
  static_assert(std::is_same_v<T, int> || std::is_same_v<T, unsigned int> || std::is_same_v<T, unsigned long long> ||
                    std::is_same_v<T, float> || std::is_same_v<T, double>,
                "CUDA's atomicAdd takes int, unsigned int, unsigned long long, float or double");
  (void)::syncbn::simt::detail::view("atomicAdd");
  const T old = *address;
  *address = old + val;
  return old;
}
