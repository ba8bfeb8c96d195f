// "Device memory" of the emulation: host memory, with a registry of the live allocations kernels may
// touch, so that a checked pointer (checked_ptr.h) knows its allocation's bounds.
//
// Two kinds of entries: the storages of an op's tensor arguments (registered for the call), and every
// CPU allocation made while an op runs (at::empty for outputs and partials, copies): those are
// registered until freed, and filled with 0xFF bytes first (NaN in every float dtype, -1 in integers),
// so a kernel that reads memory nobody wrote produces NaN instead of plausible stale values.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>

namespace syncbn::simt {

// [lo, hi) of the live allocation containing p (one past the end counts as inside); false if none.
bool find_allocation(const void* p, const char** lo, const char** hi);
// What an allocation is, for messages: "argument 'input' of batch_norm_stats" and its size.
std::string describe_allocation(const char* lo);
// Refcounted: the same storage may be an argument of one call and an allocation of an earlier one.
void register_allocation(const void* lo, size_t bytes, const std::string& what);
void unregister_allocation(const void* lo);
// Live entries (tests check that nothing leaks).
size_t allocation_count();

// Installs the tracking CPU allocator (once per process; it forwards to the previous one and only
// tracks allocations made inside a DeviceMemoryScope on the same thread).
void install_tracking_allocator();

// For the duration of one op call: its tensor arguments are device memory, and new allocations are
// tracked and poisoned.
class DeviceMemoryScope {
 public:
  using Arg = std::pair<const char*, const at::Tensor*>;
  DeviceMemoryScope(const char* op, std::initializer_list<Arg> args);
  ~DeviceMemoryScope();
  DeviceMemoryScope(const DeviceMemoryScope&) = delete;
  DeviceMemoryScope& operator=(const DeviceMemoryScope&) = delete;

 private:
  std::vector<const void*> registered_;
};

}  // namespace syncbn::simt
