// Parallel drivers shared by the two elementwise ops (elemt, backward_elemt). Private to csrc/cpu/.
#pragma once
#include <ATen/Parallel.h>

#include "layout.h"

namespace syncbn::cpu::detail {

// Values per parallel work item: small enough to balance two threads, large enough to amortise.
constexpr int64_t kElementwiseGrain = 32768;

// Planes layout: calls seg(offset, len, c) for runs of values of one channel, split across threads
// over the flat index so that even N*C < threads keeps every thread busy.
template <typename F>
void for_each_plane_segment(const InputLayout& lay, const F& seg) {
  const int64_t S = lay.s, C = lay.c;
  const int64_t numel = lay.n * C * S;
  at::parallel_for(0, numel, kElementwiseGrain, [&](int64_t b, int64_t e) {
    int64_t i = b;
    while (i < e) {
      const int64_t plane = i / S;
      const int64_t end = std::min(e, (plane + 1) * S);
      seg(i, end - i, plane % C);
      i = end;
    }
  });
}

// Rows layout: calls rows_fn(r0, r1) for ranges of `rows` rows of C channels.
template <typename F>
void for_each_row_range(int64_t rows, int64_t C, const F& rows_fn) {
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(C, 1));
  at::parallel_for(0, rows, grain, rows_fn);
}

}  // namespace syncbn::cpu::detail
