// Fiber stacks and the two context-switch backends (see fiber.h for why they are hand-written).
#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__) && defined(__linux__)
#define SYNCBN_SIMT_ASM_FIBERS 1
extern "C" {
// Pushes the callee-saved registers (SysV ABI) on the running stack, stores the stack pointer in
// *save_sp, switches to new_sp and pops the registers saved there: the `ret` resumes the other fiber.
void syncbn_simt_switch(void** save_sp, void* new_sp);
// Where a fresh fiber's first switch "returns" to: calls entry(arg) with entry in r13 and arg in r12.
void syncbn_simt_trampoline();
}
asm(R"(
  .text
  .p2align 4
  .globl syncbn_simt_switch
  .hidden syncbn_simt_switch
  .type syncbn_simt_switch, @function
syncbn_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size syncbn_simt_switch, .-syncbn_simt_switch

  .p2align 4
  .globl syncbn_simt_trampoline
  .hidden syncbn_simt_trampoline
  .type syncbn_simt_trampoline, @function
syncbn_simt_trampoline:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size syncbn_simt_trampoline, .-syncbn_simt_trampoline
)");
#endif

namespace syncbn::simt {
namespace {

// Kernel frames are small, but a fault report formats strings on the fiber's stack.
constexpr size_t kStackBytes = 256 * 1024;

FiberBackend initial_backend() {
  const char* env = std::getenv("SYNCTRAIN_SIMT_FIBERS");
  if (env != nullptr && *env != '\0') {
    const std::string v(env);
    TORCH_CHECK(v == "asm" || v == "ucontext", "SYNCTRAIN_SIMT_FIBERS=", v, ": expected 'asm' or 'ucontext'");
    if (v == "ucontext") return FiberBackend::kUcontext;
    TORCH_CHECK(asm_fibers_available(), "SYNCTRAIN_SIMT_FIBERS=asm: the asm fiber switch exists only on x86-64 "
                "Linux; use 'ucontext'");
  }
  return asm_fibers_available() ? FiberBackend::kAsm : FiberBackend::kUcontext;
}

FiberBackend& backend_setting() {
  static FiberBackend backend = initial_backend();
  return backend;
}

}  // namespace

bool asm_fibers_available() {
#ifdef SYNCBN_SIMT_ASM_FIBERS
  return true;
#else
  return false;
#endif
}

FiberBackend fiber_backend() { return backend_setting(); }

void set_fiber_backend(FiberBackend backend) {
  TORCH_CHECK(backend != FiberBackend::kAsm || asm_fibers_available(),
              "the asm fiber switch exists only on x86-64 Linux; use 'ucontext'");
  backend_setting() = backend;
}

Fiber::~Fiber() {
  if (stack_ != nullptr) munmap(stack_ - getpagesize(), stack_bytes_ + getpagesize());
  delete uc_;
}

void Fiber::ensure_stack() {
  if (stack_ != nullptr) return;
  const size_t page = getpagesize();
  void* mem = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  TORCH_CHECK(mem != MAP_FAILED, "simt: cannot map a ", kStackBytes, "-byte fiber stack: ", std::strerror(errno));
  // A stack overflow hits this page and faults at once instead of corrupting the neighbouring stack.
  TORCH_CHECK(mprotect(mem, page, PROT_NONE) == 0, "simt: cannot protect a fiber stack's guard page");
  stack_ = static_cast<char*>(mem) + page;
  stack_bytes_ = kStackBytes;
}

void Fiber::ucontext_entry(unsigned lo, unsigned hi) {
  Fiber* self = reinterpret_cast<Fiber*>((uintptr_t(hi) << 32) | uintptr_t(lo));
  self->entry_(self->arg_);
  std::abort();  // entries never return (they switch away for good)
}

void Fiber::start(FiberBackend backend, Entry entry, void* arg) {
  ensure_stack();
  backend_ = backend;
  entry_ = entry;
  arg_ = arg;
  if (backend == FiberBackend::kAsm) {
#ifdef SYNCBN_SIMT_ASM_FIBERS
    // The frame syncbn_simt_switch pops: r15, r14, r13 = entry, r12 = arg, rbx, rbp, return address.
    // After its `ret`, rsp = sp + 56 must be 16-byte aligned for the trampoline's call (SysV ABI).
    uintptr_t top = reinterpret_cast<uintptr_t>(stack_ + stack_bytes_) & ~uintptr_t(15);
    auto* frame = reinterpret_cast<void**>(top - 72);
    frame[0] = nullptr;                                        // r15
    frame[1] = nullptr;                                        // r14
    frame[2] = reinterpret_cast<void*>(entry);                 // r13
    frame[3] = arg;                                            // r12
    frame[4] = nullptr;                                        // rbx
    frame[5] = nullptr;                                        // rbp
    frame[6] = reinterpret_cast<void*>(&syncbn_simt_trampoline);  // return address
    sp_ = frame;
    return;
#else
    TORCH_CHECK(false, "simt: the asm fiber switch is not available on this platform");
#endif
  }
  if (uc_ == nullptr) uc_ = new ucontext_t;
  TORCH_CHECK(getcontext(uc_) == 0, "simt: getcontext failed");
  uc_->uc_stack.ss_sp = stack_;
  uc_->uc_stack.ss_size = stack_bytes_;
  uc_->uc_link = nullptr;
  const uintptr_t self = reinterpret_cast<uintptr_t>(this);
  makecontext(uc_, reinterpret_cast<void (*)()>(&Fiber::ucontext_entry), 2, unsigned(self & 0xffffffffu),
              unsigned(self >> 32));
}

void Fiber::switch_to(Fiber& from, Fiber& to) {
#ifdef SYNCBN_SIMT_ASM_FIBERS
  if (to.backend_ == FiberBackend::kAsm) {
    syncbn_simt_switch(&from.sp_, to.sp_);
    return;
  }
#endif
  if (from.uc_ == nullptr) from.uc_ = new ucontext_t;
  swapcontext(from.uc_, to.uc_);
}

}  // namespace syncbn::simt
