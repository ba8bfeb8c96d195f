// Cooperative fibers: every emulated CUDA thread of a block runs on its own stack, and a barrier or a
// warp shuffle switches to the next thread, so __syncthreads is a real barrier on one OS thread.
//
// Why hand-written: C++ has no fibers, and the well-kept C++ library that has them (Boost.Context) is
// not a pip package. ucontext's swapcontext makes a sigprocmask system call per switch (~0.5 us); a
// kernel test switches millions of times, so x86-64 Linux uses a 14-instruction switch that saves the
// callee-saved registers only (fibers never change the floating-point control words). Other platforms,
// or SYNCTRAIN_SIMT_FIBERS=ucontext, use ucontext.
#pragma once
#include <ucontext.h>

#include <cstddef>

#include "uninstrumented.h"

namespace syncbn::simt {

enum class FiberBackend { kAsm, kUcontext };

// Whether the fast switch exists on this platform.
bool asm_fibers_available();
// The backend launches use (default: asm where available, unless SYNCTRAIN_SIMT_FIBERS=ucontext).
FiberBackend fiber_backend();
void set_fiber_backend(FiberBackend backend);

// One execution context, reused from launch to launch (start() re-arms it on the same stack).
class Fiber {
 public:
  using Entry = void (*)(void* arg);
  Fiber() = default;
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;
  ~Fiber();

  // Run entry(arg) from its first instruction the next time this fiber is switched to. entry must
  // never return: it ends by switching away for good.
  void start(FiberBackend backend, Entry entry, void* arg);
  // For the context that is already running (the scheduler's own stack): switches back to it use
  // `backend`, which must be the one its fibers were started with.
  void adopt(FiberBackend backend) { backend_ = backend; }

  // The fiber's stack (guard page excluded): its thread's locals live there.
  SYNCBN_SIMT_UNINSTRUMENTED const char* stack_lo() const { return stack_; }
  SYNCBN_SIMT_UNINSTRUMENTED size_t stack_bytes() const { return stack_bytes_; }

  // Save the running context into `from` and resume `to`.
  static void switch_to(Fiber& from, Fiber& to);

 private:
  static void ucontext_entry(unsigned lo, unsigned hi);
  void ensure_stack();

  void* sp_ = nullptr;        // asm backend: saved stack pointer
  ucontext_t* uc_ = nullptr;  // ucontext backend: saved context (allocated on first use)
  FiberBackend backend_ = FiberBackend::kAsm;
  char* stack_ = nullptr;     // mmap'ed, with a PROT_NONE guard page at its low end
  size_t stack_bytes_ = 0;
  Entry entry_ = nullptr;
  void* arg_ = nullptr;
};

}  // namespace syncbn::simt
