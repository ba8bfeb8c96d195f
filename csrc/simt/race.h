// The emulator's race detector: what it remembers about the memory accesses of a launch, and when two
// of them conflict.
//
// How accesses are observed: the kernel sources are compiled with the host compiler's ThreadSanitizer
// instrumentation (-fsanitize=thread, added by instrumented_cxx.sh), without its runtime: every load
// and store the compiler emits calls a __tsan_* function, which race_hooks.cpp defines to hand the
// access to the executor (the emulated thread that runs, its stack, and the launch's shared memory are
// the executor's). Loads and stores inside library calls (a non-inlined memcpy) are not seen.
//
// Shared memory (static __shared__ and dynamic): every byte records its last writer and the threads
// that read it since, with the barrier phase and the warp epoch of each access. Two accesses of one
// block, by different threads, at least one a write, race unless a __syncthreads() completed between
// them (a new phase) or, for two lanes of one warp, a __syncwarp() both took part in completed between
// them: a vector clock per thread over the lanes of its warp, joined at every __syncwarp. A warp shuffle
// is no such edge: it exchanges register values, and CUDA guarantees memory ordering among lanes only at
// __syncwarp (and __syncthreads), so a store by lane A read by lane B with only a shuffle between them is
// a race (compute-sanitizer's racecheck reports it too), even though the emulator, which runs a shuffle
// as a rendezvous of its lanes, would compute the right value. Global memory: every write of a launch is logged, and two writes to one byte by two
// different threads (of any blocks) are a race. Atomics (atomicAdd) are exempt.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "uninstrumented.h"

namespace syncbn::simt::race {

// Per-thread clocks over the 32 lanes of its warp.
class WarpClocks {
 public:
  void reset(int threads);
  // Thread `tid`'s own epoch: advances at each __syncwarp it completes.
  SYNCBN_SIMT_UNINSTRUMENTED uint32_t epoch(int tid) const { return clocks_[size_t(tid)][size_t(tid % 32)]; }
  // A __syncwarp of the lanes `mask` of warp `warp` completed: each advances its epoch, then all learn
  // what each other knew. (Shuffles do not call it: they order no memory.)
  void join(int warp, unsigned mask);
  // Whether an access by thread `earlier` at its epoch `at` is ordered before what `later` does now.
  SYNCBN_SIMT_UNINSTRUMENTED bool ordered(int earlier, uint32_t at, int later) const {
    return earlier / 32 == later / 32 && clocks_[size_t(later)][size_t(earlier % 32)] > at;
  }

 private:
  std::vector<std::array<uint32_t, 32>> clocks_;
};

// What an access conflicted with.
struct Conflict {
  int thread = -1;       // the earlier access's thread (index in the block); -1: no conflict
  bool wrote = false;    // whether the earlier access was a write
  size_t offset = 0;     // byte offset in the region of the first conflicting byte
};

// Byte-by-byte history of one shared-memory region of the running block.
class SharedShadow {
 public:
  // Watch [lo, hi) from now on (forgets everything before). `poison`: bytes read before any thread of
  // the block wrote them are set to 0xFF first, as if the block started with garbage there.
  void cover(const char* lo, const char* hi, bool poison);
  SYNCBN_SIMT_UNINSTRUMENTED bool contains(const char* p) const { return p >= lo_ && p < hi_; }
  SYNCBN_SIMT_UNINSTRUMENTED const char* lo() const { return lo_; }
  // A new block, or a __syncthreads() completed: what came before is ordered with what comes after.
  void new_block() { ++block_, ++phase_; }
  void new_phase() { ++phase_; }
  // Records an access of n bytes at p by `tid` (race checks only if `check`); returns the first
  // earlier access it races with.
  Conflict access(char* p, size_t n, int tid, bool write, bool check, const WarpClocks& clocks);

 private:
  struct Cell {
    uint64_t block = 0;  // the block (generation) in which the byte was last written or poisoned
    uint64_t phase = 0;  // the phase of `writer` and `readers`; stale ones are ordered before now
    int32_t writer = -1;
    uint32_t writer_epoch = 0;
    int32_t readers = -1;  // list in nodes_
  };
  struct Reader {
    int32_t tid;
    uint32_t epoch;
    int32_t next;
  };
  const char* lo_ = nullptr;
  const char* hi_ = nullptr;
  bool poison_ = false;
  std::vector<Cell> cells_;
  std::vector<Reader> nodes_;  // emptied at each block
  uint64_t block_ = 1, phase_ = 1;
  uint64_t nodes_block_ = 0;
};

// Every write a launch made to memory outside shared memory and the threads' stacks.
class GlobalWrites {
 public:
  struct Entry {
    uintptr_t addr;
    uint32_t bytes;
    uint32_t tid;     // thread index in the block
    uint64_t block;   // linear block index (x fastest)
  };
  void clear() { log_.clear(); }
  SYNCBN_SIMT_UNINSTRUMENTED void add(const void* p, size_t n, int tid, uint64_t block) {
    log_.push_back(Entry{reinterpret_cast<uintptr_t>(p), uint32_t(n), uint32_t(tid), block});
  }
  // Two writes by different threads that overlap, of which `relevant` accepts the address (device
  // memory); false if none. Sorts the log.
  template <typename Relevant>
  bool find_overlap(Entry* a, Entry* b, Relevant relevant);

 private:
  std::vector<Entry> log_;
};

template <typename Relevant>
bool GlobalWrites::find_overlap(Entry* a, Entry* b, Relevant relevant) {
  std::sort(log_.begin(), log_.end(), [](const Entry& x, const Entry& y) { return x.addr < y.addr; });
  // Sweep in address order, keeping the write that reaches furthest: any later write that starts before
  // its end overlaps it. (Two writes by one thread, e.g. a value rewritten, are not a race.)
  const Entry* reach = nullptr;
  for (const Entry& e : log_) {
    if (reach != nullptr && e.addr < reach->addr + reach->bytes &&
        (e.tid != reach->tid || e.block != reach->block) && relevant(e.addr)) {
      *a = *reach;
      *b = e;
      return true;
    }
    if (reach == nullptr || e.addr + e.bytes > reach->addr + reach->bytes) reach = &e;
  }
  return false;
}

}  // namespace syncbn::simt::race
