// The SIMT emulation of the CUDA surface the SyncBN kernels use, for compiling csrc/cuda/*.cu with the
// host compiler (-DSYNCBN_SIMT, see csrc/cuda/runtime.cuh). Host memory plays device memory; launches
// run synchronously on the calling thread, block after block, each block's threads as fibers.
//
// What it checks, as the hardware (or a sanitizer) would: block and grid dimensions, threads per block,
// dynamic shared memory per block; every access through a kernel pointer (bounds of its allocation,
// natural alignment); barriers and warp operations that some thread skips or reaches from another
// place, and deadlocks; lanes and masks of the warp shuffles; data races on shared memory and
// conflicting writes to global memory (race.h), under the lane, warp and block orders of the launch's
// schedule (schedule.h). What it cannot show: the memory model (threads interleave only at barriers
// and shuffles, and every access is sequentially consistent), timing, and speed.
#pragma once
#include <ATen/core/Tensor.h>  // before the qualifier macros below

#include "checked_ptr.h"
#include "device_props.h"
#include "kernel_api.h"
#include "launch.h"
#include "runtime_api.h"
