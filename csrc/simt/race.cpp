// The race detector's bookkeeping (see race.h). Compiled like the rest of the emulated build, but its
// functions run inside the access hooks, so none of them may be instrumented.
#include "race.h"
#include "uninstrumented.h"

#include <algorithm>
#include <cstring>

namespace syncbn::simt::race {

SYNCBN_SIMT_UNINSTRUMENTED void WarpClocks::reset(int threads) {
  if (clocks_.size() < size_t(threads)) clocks_.resize(size_t(threads));
  std::memset(static_cast<void*>(clocks_.data()), 0, size_t(threads) * sizeof(clocks_[0]));
}

SYNCBN_SIMT_UNINSTRUMENTED void WarpClocks::join(int warp, unsigned mask) {
  std::array<uint32_t, 32> joined{};
  for (unsigned m = mask; m != 0; m &= m - 1) {
    const int lane = __builtin_ctz(m);
    auto& c = clocks_[size_t(warp * 32 + lane)];
    ++c[size_t(lane)];
    for (int k = 0; k < 32; ++k) joined[size_t(k)] = std::max(joined[size_t(k)], c[size_t(k)]);
  }
  for (unsigned m = mask; m != 0; m &= m - 1) clocks_[size_t(warp * 32 + __builtin_ctz(m))] = joined;
}

SYNCBN_SIMT_UNINSTRUMENTED void SharedShadow::cover(const char* lo, const char* hi, bool poison) {
  if (lo != lo_ || hi != hi_) {
    lo_ = lo;
    hi_ = hi;
    cells_.assign(size_t(hi - lo), Cell{});
  }
  poison_ = poison;
}

SYNCBN_SIMT_UNINSTRUMENTED Conflict SharedShadow::access(char* p, size_t n, int tid, bool write, bool check,
                                                         const WarpClocks& clocks) {
  Conflict out;
  if (nodes_block_ != block_) {
    nodes_.clear();
    nodes_block_ = block_;
  }
  const size_t first = size_t(p - lo_);
  const size_t last = std::min(first + n, size_t(hi_ - lo_));
  const uint32_t epoch = check ? clocks.epoch(tid) : 0;  // the clocks exist only while checking
  for (size_t i = first; i < last; ++i) {
    Cell& c = cells_[i];
    if (c.block != block_) {
      // First access of this byte by the block: anything recorded belongs to an earlier block.
      c.block = block_;
      c.writer = -1;
      c.readers = -1;
      c.phase = phase_;
      if (!write && poison_) p[i - first] = char(0xFF);
    }
    if (!check) continue;
    if (c.phase != phase_) {
      c.phase = phase_;
      c.writer = -1;
      c.readers = -1;
    }
    if (c.writer >= 0 && c.writer != tid && !clocks.ordered(c.writer, c.writer_epoch, tid)) {
      out.thread = c.writer;
      out.wrote = true;
      out.offset = i;
      return out;
    }
    if (write) {
      for (int32_t r = c.readers; r >= 0; r = nodes_[size_t(r)].next) {
        const Reader& rd = nodes_[size_t(r)];
        if (rd.tid != tid && !clocks.ordered(rd.tid, rd.epoch, tid)) {
          out.thread = rd.tid;
          out.wrote = false;
          out.offset = i;
          return out;
        }
      }
      c.writer = tid;
      c.writer_epoch = epoch;
      c.readers = -1;
    } else if (c.readers < 0 || nodes_[size_t(c.readers)].tid != tid) {
      nodes_.push_back(Reader{tid, epoch, c.readers});
      c.readers = int32_t(nodes_.size() - 1);
    }
  }
  return out;
}

}  // namespace syncbn::simt::race
