// State the emulated runtime keeps besides the executor: the last launch error, the launch log, the
// work counters, the dynamic shared memory opt-ins. Private to csrc/simt/.
#pragma once
#include <string>

#include "launch.h"
#include "runtime_api.h"

namespace syncbn::simt::detail {

// What cudaGetLastError returns next, and its explanation (last_error_detail).
void set_last_error(cudaError_t code, std::string detail);
// Why the device would refuse this configuration (and with which error), or "" if it would not.
std::string check_configuration(const KernelLaunch& k, dim3 grid, dim3 block, size_t shmem, cudaError_t* code);
// Records a launch in the log when recording is on.
void log_launch(const KernelLaunch& k, dim3 grid, dim3 block, size_t shmem, bool started);
// Adds one launch's work to the process totals.
void count_launch(int64_t blocks, int64_t threads, int64_t switches);
// "(x, y, z)".
std::string triple(uint3 v);

}  // namespace syncbn::simt::detail
