// The kernel sources of the emulated build are compiled with -fsanitize=thread so that every load and
// store reaches the race detector (race_hooks.cpp, instrumented_cxx.sh). Code of the emulator that
// such sources include or that runs inside that path (the hooks, the detector, what they call before
// they have marked the thread as busy) must not itself be instrumented, or it would call itself; GCC
// also inlines only between functions of the same kind, so small accessors carry the attribute too.
#pragma once

#define SYNCBN_SIMT_UNINSTRUMENTED __attribute__((no_sanitize("thread")))
