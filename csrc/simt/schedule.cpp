// Schedules of emulated launches (see schedule.h).
#include "schedule.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <numeric>

namespace syncbn::simt {
namespace {

std::mutex& override_mutex() {
  static std::mutex m;
  return m;
}
std::optional<Schedule>& override_schedule() {
  static std::optional<Schedule> s;
  return s;
}

// FNV-1a: a stable hash of the kernel's name, so a launch's random order does not depend on the
// launches before it.
uint64_t fnv1a(const char* s, uint64_t h = 1469598103934665603ull) {
  for (; *s != '\0'; ++s) h = (h ^ uint8_t(*s)) * 1099511628211ull;
  return h;
}

}  // namespace

Schedule parse_schedule(const std::string& spec, const char* source) {
  Schedule s;
  if (spec == "forward") return s;
  if (spec == "reverse") {
    s.order = Order::kReverse;
    return s;
  }
  if (spec == "random" || spec.rfind("random:", 0) == 0) {
    s.order = Order::kRandom;
    if (spec.size() > 7) {
      const std::string digits = spec.substr(7);
      char* end = nullptr;
      s.seed = std::strtoull(digits.c_str(), &end, 10);
      TORCH_CHECK(!digits.empty() && end != nullptr && *end == '\0' && digits[0] != '-', source, "='", spec,
                  "': the seed after 'random:' must be a non-negative integer");
    }
    return s;
  }
  TORCH_CHECK(false, source, "='", spec, "': expected forward, reverse, random or random:SEED");
}

std::string schedule_spec(const Schedule& s) {
  switch (s.order) {
    case Order::kForward: return "forward";
    case Order::kReverse: return "reverse";
    case Order::kRandom: return "random:" + std::to_string(s.seed);
  }
  return "forward";
}

void set_schedule(std::optional<Schedule> s) {
  std::lock_guard<std::mutex> lock(override_mutex());
  override_schedule() = s;
}

Schedule current_schedule() {
  {
    std::lock_guard<std::mutex> lock(override_mutex());
    if (override_schedule()) return *override_schedule();
  }
  const char* env = std::getenv("SYNCTRAIN_SIMT_SCHEDULE");
  if (env == nullptr || *env == '\0') return Schedule{};
  return parse_schedule(env, "SYNCTRAIN_SIMT_SCHEDULE");
}

LaunchOrder::LaunchOrder(const Schedule& s, const char* kernel, uint64_t blocks, int threads)
    : s_(s), blocks_(blocks), threads_(threads) {
  if (s_.order != Order::kRandom) return;
  rng_.seed(fnv1a(kernel, s_.seed * 0x9E3779B97F4A7C15ull + 1) ^ (blocks * 0xBF58476D1CE4E5B9ull) ^
            uint64_t(threads));
  // An affine permutation of the blocks: no O(grid) table for grids of millions of blocks.
  if (blocks_ > 1) {
    add_ = rng_() % blocks_;
    do mul_ = rng_() % blocks_; while (mul_ == 0 || std::gcd(mul_, blocks_) != 1);
  }
}

uint64_t LaunchOrder::block(uint64_t i) const {
  switch (s_.order) {
    case Order::kForward: return i;
    case Order::kReverse: return blocks_ - 1 - i;
    case Order::kRandom: return static_cast<uint64_t>((static_cast<unsigned __int128>(mul_) * i + add_) % blocks_);
  }
  return i;
}

void LaunchOrder::block_threads(std::vector<int>& order, std::vector<std::vector<int>>& lanes) {
  const int warps = (threads_ + 31) / 32;
  std::vector<int> warp_order(size_t(warps), 0);
  std::iota(warp_order.begin(), warp_order.end(), 0);
  lanes.resize(size_t(warps));
  for (int w = 0; w < warps; ++w) {
    auto& l = lanes[size_t(w)];
    l.resize(size_t(std::min(32, threads_ - w * 32)));
    std::iota(l.begin(), l.end(), w * 32);
  }
  if (s_.order == Order::kReverse) {
    std::reverse(warp_order.begin(), warp_order.end());
    for (auto& l : lanes) std::reverse(l.begin(), l.end());
  } else if (s_.order == Order::kRandom) {
    std::shuffle(warp_order.begin(), warp_order.end(), rng_);
    for (auto& l : lanes) std::shuffle(l.begin(), l.end(), rng_);
  }
  order.clear();
  for (int w : warp_order) order.insert(order.end(), lanes[size_t(w)].begin(), lanes[size_t(w)].end());
}

}  // namespace syncbn::simt
