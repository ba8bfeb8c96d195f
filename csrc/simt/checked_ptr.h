// Ptr<T>: what SYNCBN_PTR(T) is in the emulated build. A kernel pointer that carries the bounds of the
// allocation it points into, found once when the host passes a raw pointer to a launch, and checks
// every access against them (bounds and the natural alignment the hardware requires). Pointer
// arithmetic is free and unchecked, as on the device: only an access out of bounds is a fault.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace syncbn::simt {
namespace detail {
// Host side: the live device allocation holding p; raises (c10::Error) when there is none.
void bind_allocation(const void* p, const char** lo, const char** hi);
// Reports an access of `bytes` at `at` (alignment `align`) outside [lo, hi) or misaligned: a fault
// of the running emulated thread, or a c10::Error outside a kernel. Never returns.
[[noreturn]] void bad_access(const char* at, size_t bytes, size_t align, const char* lo, const char* hi);
}  // namespace detail

template <typename T>
class Ptr {
 public:
  using element_type = T;

  Ptr() = default;
  Ptr(std::nullptr_t) {}
  // The host-to-kernel conversion (kernel arguments, argument structs): looks up the allocation.
  Ptr(T* p) : p_(p) {
    if (p != nullptr) detail::bind_allocation(p, &lo_, &hi_);
  }
  // A pointer into memory the emulator owns (dynamic shared memory).
  Ptr(T* p, const char* lo, const char* hi) : p_(p), lo_(lo), hi_(hi) {}
  template <typename U, typename = std::enable_if_t<std::is_convertible_v<U*, T*>>>
  Ptr(const Ptr<U>& o) : p_(o.p_), lo_(o.lo_), hi_(o.hi_) {}

  template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
  T& operator[](I i) const {
    return *checked(offset(i), sizeof(T), alignof(T));
  }
  T& operator*() const { return *checked(p_, sizeof(T), alignof(T)); }
  T* operator->() const { return checked(p_, sizeof(T), alignof(T)); }

  template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
  Ptr operator+(I i) const {
    return Ptr(offset(i), lo_, hi_);
  }
  template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
  Ptr operator-(I i) const {
    return Ptr(offset(-int64_t(i)), lo_, hi_);
  }
  template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
  Ptr& operator+=(I i) {
    p_ = offset(i);
    return *this;
  }

  friend bool operator==(const Ptr& a, std::nullptr_t) { return a.p_ == nullptr; }
  friend bool operator!=(const Ptr& a, std::nullptr_t) { return a.p_ != nullptr; }
  explicit operator bool() const { return p_ != nullptr; }

  // The address (messages, tests); device code reads and writes through the operators only.
  T* address() const { return p_; }
  // Checked access to a whole V (a vector of several T) at this address: bounds of sizeof(V) and
  // V's alignment. Used by device_load / device_store.
  template <typename V>
  std::conditional_t<std::is_const_v<T>, const void*, void*> span() const {
    return checked(p_, sizeof(V), alignof(V));
  }

 private:
  template <typename U>
  friend class Ptr;

  // Integer arithmetic: an out-of-bounds pointer may exist (as on the device) until it is accessed.
  T* offset(int64_t i) const {
    return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p_) + uintptr_t(i * int64_t(sizeof(T))));
  }
  static T* checked(T* q, size_t bytes, size_t align, const char* lo, const char* hi) {
    const uintptr_t c = reinterpret_cast<uintptr_t>(q);
    if (c >= uintptr_t(lo) && c + bytes <= uintptr_t(hi) && c % align == 0) [[likely]]
      return q;
    detail::bad_access(reinterpret_cast<const char*>(q), bytes, align, lo, hi);
  }
  T* checked(T* q, size_t bytes, size_t align) const { return checked(q, bytes, align, lo_, hi_); }

  T* p_ = nullptr;
  const char* lo_ = nullptr;  // [lo_, hi_): the allocation; both null for a null pointer
  const char* hi_ = nullptr;
};

// Whole-object loads and stores (the kernels' 16-byte vector accesses), checked, and done with memcpy
// so the host compiler sees no type punning.
template <typename V, typename T>
inline V device_load(Ptr<T> p) {
  V v;
  std::memcpy(static_cast<void*>(&v), p.template span<V>(), sizeof(V));
  return v;
}
template <typename V, typename T>
inline void device_store(Ptr<T> p, const V& v) {
  static_assert(!std::is_const_v<T>, "device_store through a pointer to const");
  std::memcpy(p.template span<V>(), static_cast<const void*>(&v), sizeof(V));
}

}  // namespace syncbn::simt
