// The allocation registry, the tracking CPU allocator and the per-op scope (see device_memory.h).
#include "device_memory.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "checked_ptr.h"

namespace syncbn::simt {
namespace {

struct Entry {
  uintptr_t hi;
  std::vector<std::string> names;  // innermost registration last; refcount = names.size()
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::map<uintptr_t, Entry>& registry() {
  static std::map<uintptr_t, Entry> r;
  return r;
}

thread_local int tls_scope_depth = 0;
thread_local const char* tls_scope_op = nullptr;

// Forwards to the allocator that was installed before it; inside a DeviceMemoryScope it also poisons
// and registers each allocation, and unregisters it when the storage is freed.
class TrackingAllocator final : public c10::Allocator {
 public:
  explicit TrackingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    if (tls_scope_depth == 0 || n == 0 || inner.get() == nullptr) return inner;
    std::memset(inner.get(), 0xFF, n);
    register_allocation(inner.get(), n, std::string("memory allocated inside ") + tls_scope_op);
    auto* tracked = new Tracked{std::move(inner)};
    return c10::DataPtr(tracked->inner.get(), tracked, &Tracked::release, tracked->inner.device());
  }

  // Untracked allocations (all of them outside an op) are the base allocator's own DataPtrs.
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }

 private:
  struct Tracked {
    c10::DataPtr inner;
    static void release(void* ctx) {
      auto* t = static_cast<Tracked*>(ctx);
      unregister_allocation(t->inner.get());
      delete t;  // frees through the base allocator's deleter
    }
  };
  c10::Allocator* base_;
};

}  // namespace

bool find_allocation(const void* p, const char** lo, const char** hi) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  auto it = r.upper_bound(a);  // first entry starting after p; the one before may contain it
  if (it == r.begin()) return false;
  --it;
  if (a > it->second.hi) return false;
  *lo = reinterpret_cast<const char*>(it->first);
  *hi = reinterpret_cast<const char*>(it->second.hi);
  return true;
}

std::string describe_allocation(const char* lo) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  auto it = r.find(reinterpret_cast<uintptr_t>(lo));
  if (it == r.end()) return "an allocation that has been freed since";
  std::ostringstream s;
  s << it->second.names.back() << " (" << (it->second.hi - it->first) << " bytes)";
  return s.str();
}

void register_allocation(const void* lo, size_t bytes, const std::string& what) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(lo);
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  auto it = r.find(a);
  if (it != r.end()) {
    TORCH_CHECK(it->second.hi == a + bytes, "simt: ", what, " (", bytes, " bytes) overlaps ",
                it->second.names.back(), " (", it->second.hi - a, " bytes) at the same address");
    it->second.names.push_back(what);
    return;
  }
  r.emplace(a, Entry{a + bytes, {what}});
}

void unregister_allocation(const void* lo) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  auto it = r.find(reinterpret_cast<uintptr_t>(lo));
  if (it == r.end()) return;
  it->second.names.pop_back();
  if (it->second.names.empty()) r.erase(it);
}

size_t allocation_count() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return registry().size();
}

void install_tracking_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never freed: storages allocated through it keep pointing at its deleter.
    auto* tracking = new TrackingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(tracking, /*priority=*/200);
    TORCH_CHECK(c10::GetCPUAllocator() == tracking,
                "simt: another CPU allocator with a higher priority is installed; the emulated CUDA "
                "kernels need theirs to see which host memory plays device memory");
  });
}

DeviceMemoryScope::DeviceMemoryScope(const char* op, std::initializer_list<Arg> args) {
  install_tracking_allocator();
  for (const auto& [name, t] : args) {
    if (t == nullptr || !t->defined() || !t->has_storage()) continue;
    const c10::Storage& s = t->storage();
    if (s.data() == nullptr || s.nbytes() == 0) continue;
    register_allocation(s.data(), s.nbytes(), std::string("argument '") + name + "' of " + op);
    registered_.push_back(s.data());
  }
  ++tls_scope_depth;
  tls_scope_op = op;
}

DeviceMemoryScope::~DeviceMemoryScope() {
  --tls_scope_depth;
  for (const void* p : registered_) unregister_allocation(p);
}

namespace detail {

void bind_allocation(const void* p, const char** lo, const char** hi) {
  TORCH_CHECK(find_allocation(p, lo, hi), "emulated launch: a kernel argument (", p,
              ") points into no device allocation: host memory, or a tensor that is not an argument of "
              "the op and was not allocated by it");
}

}  // namespace detail
}  // namespace syncbn::simt
