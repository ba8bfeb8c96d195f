// The callbacks of the compiler's ThreadSanitizer instrumentation (-fsanitize=thread), defined here in
// place of its runtime: each plain load or store reports (address, size, read or write) to the
// executor (detail::on_access), which ignores everything outside a running emulated thread. Atomic
// operations (the host code's reference counts, std::atomic) are performed as atomics and not
// reported. Nothing here may itself be instrumented (it would call itself).
#include <cstddef>
#include <cstdint>

#include "uninstrumented.h"

namespace syncbn::simt::detail {
void on_access(void* p, size_t bytes, bool write);
}  // namespace syncbn::simt::detail

using syncbn::simt::detail::on_access;

extern "C" {

SYNCBN_SIMT_UNINSTRUMENTED void __tsan_init() {}
SYNCBN_SIMT_UNINSTRUMENTED void __tsan_func_entry(void*) {}
SYNCBN_SIMT_UNINSTRUMENTED void __tsan_func_exit() {}
SYNCBN_SIMT_UNINSTRUMENTED void __tsan_vptr_update(void**, void*) {}
SYNCBN_SIMT_UNINSTRUMENTED void __tsan_vptr_read(void**) {}
SYNCBN_SIMT_UNINSTRUMENTED void __tsan_read_range(void* p, size_t n) { on_access(p, n, false); }
SYNCBN_SIMT_UNINSTRUMENTED void __tsan_write_range(void* p, size_t n) { on_access(p, n, true); }

#define SYNCBN_SIMT_ACCESS_HOOKS(N)                                                                      \
  SYNCBN_SIMT_UNINSTRUMENTED void __tsan_read##N(void* p) { on_access(p, N, false); }                    \
  SYNCBN_SIMT_UNINSTRUMENTED void __tsan_write##N(void* p) { on_access(p, N, true); }                    \
  SYNCBN_SIMT_UNINSTRUMENTED void __tsan_unaligned_read##N(void* p) { on_access(p, N, false); }          \
  SYNCBN_SIMT_UNINSTRUMENTED void __tsan_unaligned_write##N(void* p) { on_access(p, N, true); }          \
  SYNCBN_SIMT_UNINSTRUMENTED void __tsan_volatile_read##N(void* p) { on_access(p, N, false); }           \
  SYNCBN_SIMT_UNINSTRUMENTED void __tsan_volatile_write##N(void* p) { on_access(p, N, true); }
SYNCBN_SIMT_ACCESS_HOOKS(1)
SYNCBN_SIMT_ACCESS_HOOKS(2)
SYNCBN_SIMT_ACCESS_HOOKS(4)
SYNCBN_SIMT_ACCESS_HOOKS(8)
SYNCBN_SIMT_ACCESS_HOOKS(16)
#undef SYNCBN_SIMT_ACCESS_HOOKS

// The memory-order argument is ignored: every operation is sequentially consistent, which is at least
// as strong as what was asked for.
#define SYNCBN_SIMT_ATOMIC_HOOKS(BITS, T)                                                                           \
  SYNCBN_SIMT_UNINSTRUMENTED T __tsan_atomic##BITS##_load(const volatile T* a, int) {                              \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                                    \
  }                                                                                                                 \
  SYNCBN_SIMT_UNINSTRUMENTED void __tsan_atomic##BITS##_store(volatile T* a, T v, int) {                           \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                                       \
  }                                                                                                                 \
  SYNCBN_SIMT_UNINSTRUMENTED T __tsan_atomic##BITS##_exchange(volatile T* a, T v, int) {                           \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                                             \
  }                                                                                                                 \
  SYNCBN_SIMT_UNINSTRUMENTED T __tsan_atomic##BITS##_fetch_add(volatile T* a, T v, int) {                          \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                                              \
  }                                                                                                                 \
  SYNCBN_SIMT_UNINSTRUMENTED T __tsan_atomic##BITS##_fetch_sub(volatile T* a, T v, int) {                          \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                                              \
  }                                                                                                                 \
  SYNCBN_SIMT_UNINSTRUMENTED T __tsan_atomic##BITS##_fetch_and(volatile T* a, T v, int) {                          \
    return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                                              \
  }                                                                                                                 \
  SYNCBN_SIMT_UNINSTRUMENTED T __tsan_atomic##BITS##_fetch_or(volatile T* a, T v, int) {                           \
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                                               \
  }                                                                                                                 \
  SYNCBN_SIMT_UNINSTRUMENTED T __tsan_atomic##BITS##_fetch_xor(volatile T* a, T v, int) {                          \
    return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                                              \
  }                                                                                                                 \
  SYNCBN_SIMT_UNINSTRUMENTED T __tsan_atomic##BITS##_fetch_nand(volatile T* a, T v, int) {                         \
    return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST);                                                             \
  }                                                                                                                 \
  SYNCBN_SIMT_UNINSTRUMENTED int __tsan_atomic##BITS##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) { \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                         \
  }                                                                                                                 \
  SYNCBN_SIMT_UNINSTRUMENTED int __tsan_atomic##BITS##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) { \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                          \
  }                                                                                                                 \
  SYNCBN_SIMT_UNINSTRUMENTED T __tsan_atomic##BITS##_compare_exchange_val(volatile T* a, T c, T v, int, int) {     \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                               \
    return c;                                                                                                       \
  }
SYNCBN_SIMT_ATOMIC_HOOKS(8, uint8_t)
SYNCBN_SIMT_ATOMIC_HOOKS(16, uint16_t)
SYNCBN_SIMT_ATOMIC_HOOKS(32, uint32_t)
SYNCBN_SIMT_ATOMIC_HOOKS(64, uint64_t)
#undef SYNCBN_SIMT_ATOMIC_HOOKS

SYNCBN_SIMT_UNINSTRUMENTED void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
SYNCBN_SIMT_UNINSTRUMENTED void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

}  // extern "C"
