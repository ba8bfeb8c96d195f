// What the executor reports besides results: a log of launches (name and geometry, so tests can check
// that a shape reaches the launch branch it is meant to) and running totals of the work it did.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime_api.h"

namespace syncbn::simt {

struct LaunchRecord {
  std::string kernel;  // e.g. "stats_channels_first_kernel<float, 4>"
  dim3 grid;
  dim3 block;
  size_t shmem;
  bool started;  // false: refused (invalid configuration)
};

// Starts (or stops) recording launches on every thread, dropping what was recorded so far.
void record_launches(bool enabled);
// The launches recorded since the last call (or since recording started).
std::vector<LaunchRecord> take_launch_records();
// Race detection (race.h) for the launches that start from now on, on every thread; on by default.
void set_race_detection(bool enabled);
bool race_detection();
// launches, blocks, threads, fiber_switches since the process started.
std::vector<std::pair<std::string, int64_t>> execution_counters();

}  // namespace syncbn::simt
