#!/bin/sh
# The compiler command of the emulated build (src/syncbn/extension.py sets CXX to this script): the
# kernel sources (*.cu, compiled as C++) get the compiler's ThreadSanitizer instrumentation, without
# its runtime, so that every load and store of device code calls a hook of the emulator's race
# detector (csrc/simt/race_hooks.cpp). The emulator's own sources are compiled plainly: their accesses
# are not the kernels', and instrumenting them would only slow every context switch down.
# SYNCTRAIN_SIMT_CXX is the real compiler (the CXX the build was started with, default c++).
cxx="${SYNCTRAIN_SIMT_CXX:-c++}"
for arg in "$@"; do
  case "$arg" in
    *.cu) exec $cxx -fsanitize=thread --param=tsan-instrument-func-entry-exit=0 "$@" ;;
  esac
done
exec $cxx "$@"
