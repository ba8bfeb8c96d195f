// The order in which the executor runs what a GPU runs concurrently: lanes within a warp, warps within a
// block, blocks within a grid. A correct kernel gives the same result under every order; one that
// depends on an order the hardware does not promise (a missing barrier, a reduction that assumes the
// last warp runs last) shows up as a different result, a read of poisoned memory, or a race report.
//
// Chosen per launch: set_schedule() from the emulated module, else the environment variable
// SYNCTRAIN_SIMT_SCHEDULE (read at every launch), else forward.
//   forward        lanes, warps and blocks in index order (the executor's historical order)
//   reverse        each in descending index order
//   random[:SEED]  a permutation of each, drawn per launch from SEED (default 0), the kernel's name and
//                  the launch geometry: the same launch always runs in the same order
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace syncbn::simt {

enum class Order : uint8_t { kForward, kReverse, kRandom };

struct Schedule {
  Order order = Order::kForward;
  uint64_t seed = 0;
};

// "forward", "reverse", "random" or "random:SEED"; raises (c10::Error) naming `source` otherwise.
Schedule parse_schedule(const std::string& spec, const char* source);
std::string schedule_spec(const Schedule& s);
// nullopt: fall back to SYNCTRAIN_SIMT_SCHEDULE.
void set_schedule(std::optional<Schedule> s);
// What the next launch on this process uses.
Schedule current_schedule();

// Orders of one launch: block order over the whole grid, and per block the warp and lane orders.
class LaunchOrder {
 public:
  LaunchOrder(const Schedule& s, const char* kernel, uint64_t blocks, int threads);
  // The linear index of the i-th block to run (x fastest).
  uint64_t block(uint64_t i) const;
  // Fills `order` (thread indices, warp by warp) and `lanes` (per warp, its lanes in running order).
  void block_threads(std::vector<int>& order, std::vector<std::vector<int>>& lanes);

 private:
  Schedule s_;
  uint64_t blocks_;
  int threads_;
  uint64_t mul_ = 1, add_ = 0;  // random block order: i -> (mul * i + add) mod blocks, gcd(mul, blocks) = 1
  std::mt19937_64 rng_;
};

}  // namespace syncbn::simt
