// Runs emulated launches: configuration checks, then each block's threads as fibers on the calling OS
// thread, with the barrier, the warp-synchronous operations and the fault reports they need.
//
// Scheduling: blocks run one after another, and a block's threads one at a time, each until it blocks
// (barrier, shuffle) or exits, in the orders the launch's schedule gives (schedule.h: block order,
// warp order, lane order within each warp). A barrier or warp operation completes when its last
// participant arrives, which then runs on. A lane that blocks in a warp operation, or exits, hands over
// straight to the next runnable lane of its warp in lane order (one context switch, no pass of the
// scheduler: a warp's shuffles cost one switch per lane); a thread that waits at a barrier returns to
// the scheduler, which runs the next runnable thread. If a pass finds no runnable thread while some are
// blocked, the block is deadlocked (a barrier or shuffle some thread never reaches): a fault.
//
// Memory: every load and store of the kernel code reaches on_access (race_hooks.cpp). Static
// __shared__ variables are thread_local, i.e. inside this library's TLS block: the executor watches that
// block as the static shared memory of the running block, poisoning (0xFF) each byte a block reads
// before writing it, and both shared regions go through the race detector (race.h), as do the writes to
// global memory. Executor code running on an emulated thread's fiber (barriers, shuffles, faults) is
// not the kernel's: it runs with Thread::internal set, and its accesses are not looked at.
#include <ATen/core/Tensor.h>

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "device_memory.h"
#include "device_props.h"
#include "executor.h"
#include "fiber.h"
#include "kernel_api.h"
#include "launch.h"
#include "race.h"
#include "runtime_state.h"
#include "schedule.h"
#include "uninstrumented.h"

namespace syncbn::simt {
namespace detail {
thread_local ThreadView* tls_view = nullptr;
}  // namespace detail

namespace {

enum class State : uint8_t { kReady, kAtBarrier, kAtWarpOp, kExited, kFaulted };
enum class WarpOpKind : uint8_t { kShuffle, kSyncwarp };

// One warp-synchronous operation in flight: the lanes of `mask` deposit a value, and when the last
// one arrives every participant reads the value of its source lane.
struct WarpOp {
  unsigned mask = 0;
  unsigned arrived = 0;
  int readers = 0;  // participants that have not read their result yet
  bool done = false;
  WarpOpKind kind = WarpOpKind::kShuffle;
  std::source_location loc;
  uint64_t values[32] = {};
};

struct Thread {
  ThreadView view;  // first: device code reads it through tls_view
  int tid = 0;
  int lane = 0;
  int warp = 0;
  State state = State::kReady;
  std::source_location where;  // where it waits
  WarpOp* op = nullptr;
  int lane_pos = 0;  // position in its warp's lane order
  int internal = 0;  // > 0 while executor code runs on this thread's fiber: accesses are not the kernel's
  Fiber fiber;
};

struct Warp {
  unsigned existing = 0;  // lanes this (possibly partial) warp has
  unsigned exited = 0;
  std::vector<WarpOp*> pending;  // not yet complete
};

bool same_place(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() && std::strcmp(a.file_name(), b.file_name()) == 0;
}

std::string where(const std::source_location& loc) {
  std::string f = loc.file_name();
  const auto slash = f.find_last_of('/');
  if (slash != std::string::npos) f = f.substr(slash + 1);
  return f + ":" + std::to_string(loc.line());
}

std::string hex(unsigned v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

// The per-OS-thread machinery: fibers and thread records are reused from launch to launch.
class Executor {
 public:
  void run(const KernelLaunch& k, dim3 grid, dim3 block, size_t shmem);

  // Called from emulated threads (on their fibers).
  void syncthreads(const std::source_location& loc);
  const WarpOp& warp_op(WarpOpKind kind, unsigned mask, uint64_t value, const std::source_location& loc);
  void finish_read(const WarpOp& op);
  [[noreturn]] void fault(const std::string& what);
  void* dynamic_shared(size_t* bytes) {
    *bytes = shmem_bytes_;
    return shmem_.data();
  }
  bool in_kernel() const { return current_ != nullptr; }
  Thread& current() { return *current_; }
  static void thread_main(void* arg);
  void on_access(char* p, size_t bytes, bool write);
  void on_kernel_access(Thread& t, char* p, size_t bytes, bool write);

 private:
  void run_block(uint3 block_idx);
  void yield(Thread& t);
  void switch_within_warp(Thread& t);
  void thread_exit(Thread& t);
  std::string deadlock_report() const;
  std::string who(const Thread& t) const {
    return std::string(kernel_->name) + " block " + detail::triple(t.view.block_idx) + " thread " + detail::triple(t.view.thread_idx);
  }

  void shared_access(race::SharedShadow& shadow, Thread& t, char* p, size_t bytes, bool write);
  void check_global_writes();
  std::string who_else(int tid) const { return "thread " + detail::triple(threads_[size_t(tid)]->view.thread_idx); }

  const KernelLaunch* kernel_ = nullptr;
  dim3 grid_, block_;
  std::vector<int> order_;                // the block's threads in running order
  std::vector<std::vector<int>> lanes_;   // per warp, its threads in lane order
  uint64_t block_linear_ = 0;
  // Race detection (race.h) and the static shared memory (this library's TLS block on this OS thread).
  bool detect_ = true;
  race::WarpClocks clocks_;
  race::SharedShadow static_shared_, dynamic_shared_;
  race::GlobalWrites global_writes_;
  const char* static_lo_touched_ = nullptr;  // lowest static shared address this launch accessed
  FiberBackend backend_ = FiberBackend::kAsm;
  Fiber scheduler_;
  std::vector<std::unique_ptr<Thread>> threads_;
  int nthreads_ = 0;
  std::vector<Warp> warps_;
  std::vector<std::unique_ptr<WarpOp>> op_pool_;
  std::vector<WarpOp*> free_ops_;
  std::vector<unsigned char> shmem_;
  size_t shmem_bytes_ = 0;
  Thread* current_ = nullptr;
  int live_ = 0;
  int exited_ = 0;
  int at_barrier_ = 0;
  std::source_location barrier_loc_;
  std::string fault_;
  bool running_ = false;
  Schedule schedule_;
  int64_t switches_ = 0;  // this launch's, added to the process totals when it ends
};

Executor& executor() {
  static thread_local Executor ex;
  return ex;
}

// Whether race detection is on (set_race_detection); on by default.
std::atomic<bool> g_detect_races{true};

// [lo, hi) of this library's TLS block on the calling OS thread: where its thread_local variables,
// and so the kernels' static __shared__ arrays, live.
struct TlsBlock {
  const char* lo = nullptr;
  const char* hi = nullptr;
  const char* target = nullptr;
};

int find_tls_block(dl_phdr_info* info, size_t, void* data) {
  auto* b = static_cast<TlsBlock*>(data);
  if (info->dlpi_tls_data == nullptr) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    if (info->dlpi_phdr[i].p_type != PT_TLS) continue;
    const char* lo = static_cast<const char*>(info->dlpi_tls_data);
    const char* hi = lo + info->dlpi_phdr[i].p_memsz;
    if (b->target >= lo && b->target < hi) {
      b->lo = lo;
      b->hi = hi;
      return 1;
    }
  }
  return 0;
}

TlsBlock library_tls_block() {
  static thread_local TlsBlock block;
  if (block.lo == nullptr) {
    block.target = reinterpret_cast<const char*>(&detail::tls_view);
    dl_iterate_phdr(&find_tls_block, &block);
    TORCH_CHECK(block.lo != nullptr, "simt: could not find the emulated library's thread-local storage block "
                "(static __shared__ memory)");
  }
  return block;
}

// Marks executor code that runs on an emulated thread's fiber (its accesses are not the kernel's).
// Uninstrumented: the access hook would otherwise see (and recurse on) the counter's own update.
SYNCBN_SIMT_UNINSTRUMENTED void enter_internal(Thread& t) { ++t.internal; }
SYNCBN_SIMT_UNINSTRUMENTED void leave_internal(Thread& t) { --t.internal; }

struct Internal {
  Thread* t;
  SYNCBN_SIMT_UNINSTRUMENTED explicit Internal(Thread* thread) : t(thread) {
    if (t != nullptr) enter_internal(*t);
  }
  SYNCBN_SIMT_UNINSTRUMENTED ~Internal() {
    if (t != nullptr) leave_internal(*t);
  }
  Internal(const Internal&) = delete;
  Internal& operator=(const Internal&) = delete;
};

void Executor::yield(Thread& t) {
  ++switches_;
  Fiber::switch_to(t.fiber, scheduler_);
}

// t cannot run on: resume the next runnable lane of its warp (whoever resumes t later sets current_).
void Executor::switch_within_warp(Thread& t) {
  const std::vector<int>& order = lanes_[size_t(t.warp)];
  const int lanes = int(order.size());
  for (int k = 1; k < lanes; ++k) {
    Thread& next = *threads_[size_t(order[size_t((t.lane_pos + k) % lanes)])];
    if (next.state != State::kReady) continue;
    current_ = &next;
    detail::tls_view = &next.view;
    ++switches_;
    Fiber::switch_to(t.fiber, next.fiber);
    return;
  }
  yield(t);
}

void Executor::thread_main(void* arg) {
  Thread& t = *static_cast<Thread*>(arg);
  Executor& ex = executor();
  try {
    leave_internal(t);  // the kernel's own code
    ex.kernel_->invoke(ex.kernel_->params);
    enter_internal(t);
  } catch (const std::exception& e) {
    enter_internal(t);
    ex.fault(std::string("the kernel threw: ") + e.what());
  } catch (...) {
    enter_internal(t);
    ex.fault("the kernel threw a non-standard exception");
  }
  ex.thread_exit(t);
  ex.switch_within_warp(t);  // never resumed
  std::abort();
}

void Executor::fault(const std::string& what) {
  Thread& t = *current_;
  enter_internal(t);  // never undone: the thread does not run again
  if (fault_.empty()) fault_ = who(t) + ": " + what;
  t.state = State::kFaulted;
  yield(t);  // never resumed: the launch is abandoned
  std::abort();
}

void Executor::thread_exit(Thread& t) {
  enter_internal(t);  // the kernel returned (or threw): what follows is the executor's
  if (at_barrier_ > 0)
    fault("returned while " + std::to_string(at_barrier_) + " thread(s) of its block wait at __syncthreads() (" +
          where(barrier_loc_) + "): every thread must reach each barrier");
  Warp& w = warps_[t.warp];
  const unsigned bit = 1u << t.lane;
  for (const WarpOp* op : w.pending)
    if ((op->mask & bit) && !(op->arrived & bit))
      fault("returned while lanes " + hex(op->arrived) + " of its warp wait for it in a warp operation (" +
            where(op->loc) + ", mask " + hex(op->mask) + ")");
  w.exited |= bit;
  t.state = State::kExited;
  --live_;
  ++exited_;
}

void Executor::syncthreads(const std::source_location& loc) {
  Thread& t = *current_;
  if (exited_ > 0)
    fault("__syncthreads() (" + where(loc) + ") after " + std::to_string(exited_) +
          " thread(s) of its block returned: every thread must reach each barrier");
  if (at_barrier_ == 0) {
    barrier_loc_ = loc;
  } else if (!same_place(loc, barrier_loc_)) {
    fault("divergent __syncthreads(): this thread is at " + where(loc) + ", " + std::to_string(at_barrier_) +
          " other(s) wait at " + where(barrier_loc_));
  }
  if (++at_barrier_ == live_) {
    for (int i = 0; i < nthreads_; ++i)
      if (threads_[i]->state == State::kAtBarrier) threads_[i]->state = State::kReady;
    at_barrier_ = 0;
    // Everything before the barrier is ordered with everything after it, for every pair of threads.
    static_shared_.new_phase();
    dynamic_shared_.new_phase();
    return;
  }
  t.state = State::kAtBarrier;
  t.where = loc;
  yield(t);
}

const WarpOp& Executor::warp_op(WarpOpKind kind, unsigned mask, uint64_t value, const std::source_location& loc) {
  Thread& t = *current_;
  Warp& w = warps_[t.warp];
  const unsigned bit = 1u << t.lane;
  const char* what = kind == WarpOpKind::kShuffle ? "warp shuffle" : "__syncwarp";
  if (!(mask & bit))
    fault(std::string(what) + " (" + where(loc) + ") with mask " + hex(mask) + ", which does not include the calling lane " +
          std::to_string(t.lane));
  if (mask & ~w.existing)
    fault(std::string(what) + " (" + where(loc) + ") with mask " + hex(mask) + " names lanes " + hex(mask & ~w.existing) +
          " that do not exist (warp " + std::to_string(t.warp) + " of a " + std::to_string(nthreads_) +
          "-thread block has lanes " + hex(w.existing) + ")");
  if (mask & w.exited)
    fault(std::string(what) + " (" + where(loc) + ") with mask " + hex(mask) + " names lanes " + hex(mask & w.exited) +
          " that have returned");
  WarpOp* op = nullptr;
  for (WarpOp* p : w.pending) {
    if (!(p->mask & mask)) continue;  // an independent group of lanes (e.g. the other half-warp)
    if (p->mask != mask)
      fault(std::string(what) + " (" + where(loc) + ") with mask " + hex(mask) + " while lanes " + hex(p->arrived) +
            " wait with mask " + hex(p->mask) + " (" + where(p->loc) + "): the lanes disagree on the mask");
    if (p->kind != kind || !same_place(p->loc, loc))
      fault(std::string(what) + " at " + where(loc) + " while lanes " + hex(p->arrived) + " of the same mask wait at " +
            where(p->loc) + ": divergent warp operations");
    op = p;
    break;
  }
  if (op == nullptr) {
    if (free_ops_.empty()) {
      op_pool_.push_back(std::make_unique<WarpOp>());
      free_ops_.push_back(op_pool_.back().get());
    }
    op = free_ops_.back();
    free_ops_.pop_back();
    op->mask = mask;
    op->arrived = 0;
    op->done = false;
    op->kind = kind;
    op->loc = loc;
    w.pending.push_back(op);
  }
  op->values[t.lane] = value;
  op->arrived |= bit;
  if (op->arrived == mask) {
    // A __syncwarp orders the participating lanes' memory accesses from here on; a shuffle only moves
    // values (CUDA gives it no memory ordering), so it joins no clocks.
    if (detect_ && kind == WarpOpKind::kSyncwarp) clocks_.join(t.warp, mask);
    op->done = true;
    op->readers = std::popcount(mask);
    w.pending.erase(std::find(w.pending.begin(), w.pending.end(), op));
    const int base = t.warp * 32;
    for (unsigned m = mask & ~bit; m != 0; m &= m - 1) threads_[base + std::countr_zero(m)]->state = State::kReady;
    return *op;
  }
  t.state = State::kAtWarpOp;
  t.where = loc;
  t.op = op;
  switch_within_warp(t);
  return *op;
}

void Executor::finish_read(const WarpOp& cop) {
  auto& op = const_cast<WarpOp&>(cop);
  if (--op.readers == 0) free_ops_.push_back(&op);
}

std::string Executor::deadlock_report() const {
  std::ostringstream s;
  s << "deadlock: no thread of the block can proceed.";
  int at_barrier = 0;
  for (int i = 0; i < nthreads_; ++i) at_barrier += threads_[i]->state == State::kAtBarrier;
  if (at_barrier > 0)
    s << " " << at_barrier << " of " << live_ << " live thread(s) wait at __syncthreads() (" << where(barrier_loc_) << ").";
  for (size_t wi = 0; wi < warps_.size(); ++wi)
    for (const WarpOp* op : warps_[wi].pending) {
      const unsigned missing = op->mask & ~op->arrived;
      s << " Warp " << wi << ": lanes " << hex(op->arrived) << " wait at " << where(op->loc) << " (mask " << hex(op->mask)
        << ") for lanes " << hex(missing);
      const Thread& other = *threads_[wi * 32 + std::countr_zero(missing)];
      if (other.state == State::kAtBarrier) s << ", which wait at __syncthreads()";
      else if (other.state == State::kAtWarpOp) s << ", which wait at " << where(other.where);
      s << ".";
    }
  return s.str();
}

void Executor::run_block(uint3 block_idx) {
  const int bx = int(block_.x), bxy = int(block_.x * block_.y);
  for (int i = 0; i < nthreads_; ++i) {
    Thread& t = *threads_[i];
    t.tid = i;
    t.lane = i % 32;
    t.warp = i / 32;
    t.view = ThreadView{uint3{unsigned(i % bx), unsigned((i / bx) % int(block_.y)), unsigned(i / bxy)}, block_idx,
                        block_, grid_, this};
    t.state = State::kReady;
    t.op = nullptr;
    t.internal = 1;  // until thread_main hands over to the kernel
    t.fiber.start(backend_, &Executor::thread_main, &t);
  }
  for (const auto& lanes : lanes_)
    for (size_t k = 0; k < lanes.size(); ++k) threads_[size_t(lanes[k])]->lane_pos = int(k);
  static_shared_.new_block();
  dynamic_shared_.new_block();
  if (detect_) clocks_.reset(nthreads_);
  for (size_t w = 0; w < warps_.size(); ++w) {
    const int lanes = std::min(32, nthreads_ - int(w) * 32);
    warps_[w].existing = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    warps_[w].exited = 0;
    for (WarpOp* op : warps_[w].pending) free_ops_.push_back(op);
    warps_[w].pending.clear();
  }
  if (shmem_bytes_ > 0) std::memset(shmem_.data(), 0xFF, shmem_bytes_);  // uninitialised, as on the device
  live_ = nthreads_;
  exited_ = 0;
  at_barrier_ = 0;
  while (live_ > 0) {
    bool ran = false;
    for (int k = 0; k < nthreads_ && fault_.empty(); ++k) {
      Thread& t = *threads_[size_t(order_[size_t(k)])];
      if (t.state != State::kReady) continue;
      current_ = &t;
      detail::tls_view = &t.view;
      ++switches_;
      Fiber::switch_to(scheduler_, t.fiber);
      detail::tls_view = nullptr;
      current_ = nullptr;
      ran = true;
    }
    if (!fault_.empty()) return;
    if (!ran && live_ > 0) {
      fault_ = std::string(kernel_->name) + " block " + detail::triple(block_idx) + ": " + deadlock_report();
      return;
    }
  }
}

void Executor::run(const KernelLaunch& k, dim3 grid, dim3 block, size_t shmem) {
  TORCH_CHECK(!running_, "emulated launch of ", k.name, " from inside a running kernel: dynamic parallelism is "
              "not emulated");
  schedule_ = current_schedule();  // may raise (a bad SYNCTRAIN_SIMT_SCHEDULE): before anything changes
  running_ = true;
  kernel_ = &k;
  grid_ = grid;
  block_ = block;
  backend_ = fiber_backend();
  scheduler_.adopt(backend_);
  nthreads_ = int(block.x * block.y * block.z);
  while (int(threads_.size()) < nthreads_) threads_.push_back(std::make_unique<Thread>());
  warps_.assign(size_t((nthreads_ + 31) / 32), Warp{});
  shmem_bytes_ = shmem;
  if (shmem_.size() < shmem) shmem_.resize(shmem);
  fault_.clear();
  switches_ = 0;
  detect_ = g_detect_races.load();
  // Dynamic shared memory is poisoned in whole at each block; static shared memory byte by byte, when
  // a block first reads a byte it has not written.
  const auto* shmem_lo = reinterpret_cast<const char*>(shmem_.data());
  dynamic_shared_.cover(shmem_lo, shmem_lo + shmem_bytes_, false);
  const TlsBlock tls = library_tls_block();
  static_shared_.cover(tls.lo, tls.hi, true);
  static_lo_touched_ = nullptr;
  global_writes_.clear();
  const uint64_t total = uint64_t(grid.x) * grid.y * grid.z;
  LaunchOrder order(schedule_, k.name, total, nthreads_);
  order.block_threads(order_, lanes_);
  int64_t blocks = 0;
  for (uint64_t i = 0; i < total && fault_.empty(); ++i) {
    const uint64_t b = order.block(i);
    if (i > 0 && schedule_.order == Order::kRandom) order.block_threads(order_, lanes_);
    block_linear_ = b;
    run_block(uint3{unsigned(b % grid.x), unsigned(b / grid.x % grid.y), unsigned(b / (uint64_t(grid.x) * grid.y))});
    ++blocks;
  }
  if (fault_.empty() && detect_) check_global_writes();
  global_writes_.clear();
  detail::count_launch(blocks, blocks * nthreads_, switches_);
  switches_ = 0;
  running_ = false;
  kernel_ = nullptr;
  if (!fault_.empty()) {
    std::string msg;
    msg.swap(fault_);
    TORCH_CHECK(false, "CUDA error: emulated kernel fault: ", msg);
  }
}

// Every load and store of code compiled into the emulated library, while an emulated thread runs.
SYNCBN_SIMT_UNINSTRUMENTED void Executor::on_access(char* p, size_t bytes, bool write) {
  Thread* t = current_;
  if (t == nullptr || t->internal > 0) return;
  // Busy from here: what follows may call instrumented code (allocations), whose accesses are ours.
  ++t->internal;
  on_kernel_access(*t, p, bytes, write);
  --t->internal;
}

SYNCBN_SIMT_UNINSTRUMENTED void Executor::on_kernel_access(Thread& thread, char* p, size_t bytes, bool write) {
  Thread* t = &thread;
  const char* stack = t->fiber.stack_lo();
  if (p >= stack && p < stack + t->fiber.stack_bytes()) return;  // the thread's own locals
  // The emulator's own thread-locals share the TLS block with the static shared arrays: threadIdx & co.
  // read tls_view, and the executor (this object) may be reached from device code on its way to a fault.
  const auto* view_slot = reinterpret_cast<const char*>(&detail::tls_view);
  if (p >= view_slot && p < view_slot + sizeof(detail::tls_view)) return;
  if (p >= reinterpret_cast<const char*>(this) && p < reinterpret_cast<const char*>(this + 1)) return;
  if (dynamic_shared_.contains(p)) {
    shared_access(dynamic_shared_, *t, p, bytes, write);
  } else if (static_shared_.contains(p)) {
    if (static_lo_touched_ == nullptr || p < static_lo_touched_) static_lo_touched_ = p;
    shared_access(static_shared_, *t, p, bytes, write);
  } else if (write && detect_) {
    global_writes_.add(p, bytes, t->tid, block_linear_);
  }
}

SYNCBN_SIMT_UNINSTRUMENTED void Executor::shared_access(race::SharedShadow& shadow, Thread& t, char* p, size_t bytes,
                                                        bool write) {
  const race::Conflict c = shadow.access(p, bytes, t.tid, write, detect_, clocks_);
  if (c.thread < 0) return;
  std::ostringstream s;
  s << "data race on ";
  if (&shadow == &dynamic_shared_) {
    s << "dynamic shared memory at byte offset " << c.offset;
  } else {
    s << "static __shared__ memory at byte offset " << (shadow.lo() + c.offset - static_lo_touched_)
      << " from the lowest static shared address this launch touched";
  }
  s << ": " << who_else(c.thread) << " " << (c.wrote ? "wrote" : "read") << " it, then this thread "
    << (write ? "wrote" : "read") << " it, with no __syncthreads() between them"
    << (c.thread / 32 == t.tid / 32 ? " and no __syncwarp() of both lanes (a shuffle orders no memory)"
                                    : " (threads of different warps are ordered by __syncthreads() only)");
  fault(s.str());
}

void Executor::check_global_writes() {
  race::GlobalWrites::Entry a{}, b{};
  const bool found = global_writes_.find_overlap(&a, &b, [](uintptr_t addr) {
    const char *lo = nullptr, *hi = nullptr;
    return find_allocation(reinterpret_cast<const void*>(addr), &lo, &hi) && reinterpret_cast<const char*>(addr) < hi;
  });
  if (!found) return;
  const char *lo = nullptr, *hi = nullptr;
  find_allocation(reinterpret_cast<const void*>(b.addr), &lo, &hi);
  auto block_of = [&](uint64_t linear) {
    return detail::triple(uint3{unsigned(linear % grid_.x), unsigned(linear / grid_.x % grid_.y),
                                unsigned(linear / (uint64_t(grid_.x) * grid_.y))});
  };
  auto thread_of = [&](uint32_t tid) {
    const int bx = int(block_.x), bxy = int(block_.x * block_.y);
    return detail::triple(uint3{unsigned(int(tid) % bx), unsigned((int(tid) / bx) % int(block_.y)), unsigned(int(tid) / bxy)});
  };
  std::ostringstream s;
  s << kernel_->name << ": data race on global memory: block " << block_of(a.block) << " thread " << thread_of(a.tid)
    << " and block " << block_of(b.block) << " thread " << thread_of(b.tid) << " both wrote byte offset "
    << (reinterpret_cast<const char*>(b.addr) - lo) << " of " << describe_allocation(lo)
    << " in one launch (only atomics may update one address from several threads)";
  fault_ = s.str();
}

}  // namespace

void set_race_detection(bool enabled) { g_detect_races.store(enabled); }
bool race_detection() { return g_detect_races.load(); }

void launch_kernel(const KernelLaunch& k, dim3 grid, dim3 block, size_t shmem) {
  cudaError_t code = cudaSuccess;
  const std::string why = detail::check_configuration(k, grid, block, shmem, &code);
  detail::log_launch(k, grid, block, shmem, code == cudaSuccess);
  if (code != cudaSuccess) {
    detail::set_last_error(code, std::string("launch of ") + k.name + " refused: " + why);
    return;
  }
  executor().run(k, grid, block, shmem);
}

namespace detail {

[[noreturn]] void outside_kernel(const char* what) {
  TORCH_CHECK(false, "simt: ", what, " used outside an emulated kernel");
}

static Executor& running_executor(const char* what) { return *static_cast<Executor*>(view(what).executor); }

SYNCBN_SIMT_UNINSTRUMENTED void on_access(void* p, size_t bytes, bool write) {
  const ThreadView* v = tls_view;
  if (v != nullptr) static_cast<Executor*>(v->executor)->on_access(static_cast<char*>(p), bytes, write);
}

void syncthreads(const std::source_location& loc) {
  Executor& ex = running_executor("__syncthreads");
  const Internal internal(&ex.current());
  ex.syncthreads(loc);
}

void syncwarp(unsigned mask, const std::source_location& loc) {
  Executor& ex = running_executor("__syncwarp");
  const Internal internal(&ex.current());
  ex.finish_read(ex.warp_op(WarpOpKind::kSyncwarp, mask, 0, loc));
}

uint64_t shuffle(ShuffleMode mode, unsigned mask, uint64_t value, int lane_arg, int width,
                 const std::source_location& loc) {
  Executor& ex = running_executor("a warp shuffle");
  const Internal internal(&ex.current());
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    ex.fault("warp shuffle (" + where(loc) + ") with width " + std::to_string(width) +
             ": it must be a power of 2 from 1 to 32");
  const WarpOp& op = ex.warp_op(WarpOpKind::kShuffle, mask, value, loc);
  // PTX shfl.sync, with the c operand CUDA's intrinsics pass: segmask = 32 - width, clamp = 31 (0 for up).
  const int lane = ex.current().lane;
  const int b = lane_arg & 31;
  const int segmask = (32 - width) & 31;
  const int clamp = mode == ShuffleMode::kUp ? 0 : 31;
  const int max_lane = (lane & segmask) | (clamp & ~segmask);
  const int min_lane = lane & segmask;
  int j = lane;
  bool in_range = false;
  switch (mode) {
    case ShuffleMode::kUp: j = lane - b; in_range = j >= max_lane; break;
    case ShuffleMode::kDown: j = lane + b; in_range = j <= max_lane; break;
    case ShuffleMode::kXor: j = lane ^ b; in_range = j <= max_lane; break;
    case ShuffleMode::kIdx: j = min_lane | (b & ~segmask); in_range = j <= max_lane; break;
  }
  if (!in_range) j = lane;
  if (!(op.mask >> j & 1u)) {
    ex.finish_read(op);
    ex.fault("warp shuffle (" + where(loc) + ") reads lane " + std::to_string(j) + ", which is not in its mask " +
             hex(op.mask) + " (the value would be undefined)");
  }
  const uint64_t out = op.values[j];
  ex.finish_read(op);
  return out;
}

void* dynamic_shared_base(size_t* bytes) {
  return running_executor("dynamic shared memory").dynamic_shared(bytes);
}

[[noreturn]] void bad_access(const char* at, size_t bytes, size_t align, const char* lo, const char* hi) {
  // Through tls_view, not executor(): the fault below ends the thread, and what leads to it is not the
  // kernel's access.
  Executor* ex = tls_view != nullptr ? static_cast<Executor*>(tls_view->executor) : nullptr;
  if (ex != nullptr && ex->in_kernel()) enter_internal(ex->current());
  std::ostringstream s;
  if (lo == nullptr) {
    s << "access of " << bytes << " bytes through a null pointer";
  } else {
    const auto off = reinterpret_cast<intptr_t>(at) - reinterpret_cast<intptr_t>(lo);
    const bool inside = at >= lo && at + bytes <= hi;
    if (inside) {
      s << "misaligned access: " << bytes << " bytes at byte offset " << off << " (address " << static_cast<const void*>(at)
        << " is not a multiple of " << align << ")";
    } else {
      s << "out-of-bounds access: " << bytes << " bytes at byte offset " << off << " of ";
    }
    s << (inside ? " in " : "") << describe_allocation(lo);
  }
  if (ex != nullptr && ex->in_kernel()) ex->fault(s.str());
  TORCH_CHECK(false, "simt: ", s.str());
}

}  // namespace detail
}  // namespace syncbn::simt

