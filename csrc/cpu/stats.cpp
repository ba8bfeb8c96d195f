// batch_norm_stats: per-channel count, mean and M2 in one read of x (tiles are re-read from cache,
// never from memory), merged across tiles and threads with Chan's formula, relative to each channel's first
// value (moments.h: why, and the range in which float32 passes are exact enough).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/zeros.h>

#include <vector>

#include "../ops.h"
#include "layout.h"
#include "moments.h"

namespace syncbn::cpu {
namespace {
using namespace detail;

// Values per two-pass tile in the planes layout: 32 KiB of fp32, so the second pass hits L1/L2.
constexpr int64_t kPlaneTile = 8192;
// Rows per tile in the rows layout: at most 64, fewer when C is large, so that a tile (rows * C <= 64Ki values,
// 256 KiB of fp32) stays in L2 for pass 2. Pass 1's float32 sum of x - K over a tile gives the centre of pass 2,
// whose corrected two-pass formula absorbs a centre off by rounding as long as it stays within a few std of the
// tile's mean. The tiles merge in float64, with one merge weight for all channels (every channel of a tile has
// len values).
constexpr int64_t kRowTileValues = 65536;
constexpr int64_t kMaxTileRows = 64;
constexpr int64_t kMinTileRows = 16;

// Count, mean (relative to each channel's shift) and M2 of every channel of the rows seen so far: one count for
// all channels.
struct RowMoments {
  int64_t n = 0;
  std::vector<double> mean, m2;
  explicit RowMoments(int64_t C) : mean(C, 0.0), m2(C, 0.0) {}
};

template <typename scalar_t>
inline void accumulate_plane(const scalar_t* p, int64_t len, acc_type<scalar_t> k, Moments& m) {
  for (int64_t t = 0; t < len; t += kPlaneTile) {
    const int64_t l = std::min(kPlaneTile, len - t);
    double mean, m2;
    contiguous_moments(p + t, l, k, mean, m2);
    m.merge(l, mean, m2);
  }
}

// Moments of G consecutive planes (channels c..c+G-1 of one sample, G*S <= kPlaneTile values):
// first every plane's pass 1, then every pass 2, so the per-plane dependency chains
// (sum -> centre -> deviations -> merge) overlap instead of serialising; pass 2 reads from L1/L2.
template <typename scalar_t>
void accumulate_plane_group(const scalar_t* p, int64_t S, int64_t G, const acc_type<scalar_t>* k, Moments* m) {
  using acc_t = acc_type<scalar_t>;
  constexpr int64_t kMaxGroup = 256;
  acc_t centre[kMaxGroup];
  const acc_t inv_s = acc_t(1) / static_cast<acc_t>(S);
  const double inv_s_d = 1.0 / static_cast<double>(S);
  for (int64_t g = 0; g < G; ++g) centre[g] = k[g] + shifted_sum(p + g * S, S, k[g]) * inv_s;
  for (int64_t g = 0; g < G; ++g) {
    double sd, sq, mean, m2;
    centered_sums(p + g * S, S, centre[g], sd, sq);
    if (float_sums_hold(centre[g], sd, sq))
      tile_result(inv_s_d, centre[g], k[g], sd, sq, mean, m2);
    else
      wide_moments(p + g * S, S, 1, static_cast<double>(k[g]), mean, m2);
    m[g].merge(S, mean, m2);
  }
}

// Moments of channels c0..c1 of sample n (a contiguous run of planes), added to m[c0..c1).
template <typename scalar_t>
inline void accumulate_sample(const scalar_t* x, int64_t C, int64_t S, int64_t n, int64_t c0, int64_t c1,
                              const acc_type<scalar_t>* k, Moments* m) {
  if (S > kPlaneTile / 2) {
    for (int64_t c = c0; c < c1; ++c) accumulate_plane(x + (n * C + c) * S, S, k[c], m[c]);
    return;
  }
  const int64_t G = std::min<int64_t>(256, kPlaneTile / S);
  for (int64_t c = c0; c < c1; c += G)
    accumulate_plane_group(x + (n * C + c) * S, S, std::min(G, c1 - c), k + c, m + c);
}

template <typename scalar_t>
void stats_planes(const scalar_t* x, const InputLayout& lay, const acc_type<scalar_t>* k, std::vector<Moments>& out) {
  const int64_t N = lay.n, C = lay.c, S = lay.s;
  // Memory is walked forward (one stream per thread): grouping a channel's planes across the
  // batch instead (N streams at stride C*S) measured slower.
  if (C >= at::get_num_threads() || N == 1) {
    // Each thread owns a channel range and streams the contiguous block x[n, c0:c1, :] per n.
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t n = 0; n < N; ++n) accumulate_sample(x, C, S, n, c0, c1, k, out.data());
    });
    return;
  }
  // Few channels: split the batch, keep per-chunk partials, merge them in a fixed order.
  const int64_t chunks = num_chunks(N, 1);
  std::vector<std::vector<Moments>> part(chunks, std::vector<Moments>(C));
  at::parallel_for(0, chunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t q = k0; q < k1; ++q)
      for (int64_t n = N * q / chunks; n < N * (q + 1) / chunks; ++n)
        accumulate_sample(x, C, S, n, 0, C, k, part[q].data());
  });
  for (int64_t q = 0; q < chunks; ++q)
    for (int64_t c = 0; c < C; ++c) out[c].merge(part[q][c]);
}

// Per-thread buffers of the rows layout's tiles, one value per channel.
template <typename acc_t>
struct RowScratch {
  std::vector<acc_t> centre, sd;
  std::vector<double> sq;
  explicit RowScratch(int64_t C) : centre(C), sd(C), sq(C) {}
};

// Two-pass moments of a tile of `len` rows of C channels, merged into `m`. Both passes walk the rows in blocks of
// kSquareRun, keeping each channel vector's sums in registers across a block; sums of squares reach float64
// once per block (moments.h).
template <typename scalar_t>
void accumulate_row_tile(const scalar_t* p, int64_t len, int64_t C, const acc_type<scalar_t>* k,
                         RowScratch<acc_type<scalar_t>>& t, RowMoments& m) {
  using IO = VecIO<scalar_t>;
  using acc_t = typename IO::acc_t;
  using AVec = typename IO::AVec;
  constexpr int64_t W = IO::kWidth;
  const int64_t vec_c = C - C % IO::kStep;
  std::fill(t.centre.begin(), t.centre.end(), acc_t(0));
  std::fill(t.sd.begin(), t.sd.end(), acc_t(0));
  std::fill(t.sq.begin(), t.sq.end(), 0.0);
  acc_t* s = t.centre.data();  // pass 1's sums of x - k, then the centres
  acc_t* d = t.sd.data();
  double* q = t.sq.data();
  // Pass 1: sum(x - k) per channel.
  for (int64_t r0 = 0; r0 < len; r0 += kSquareRun) {
    const int64_t r1 = std::min(len, r0 + kSquareRun);
    for (int64_t c = 0; c < vec_c; c += IO::kStep) {
      const AVec ka = AVec::loadu(k + c), kb = AVec::loadu(k + c + W);
      AVec ta = AVec::loadu(s + c), tb = AVec::loadu(s + c + W), a, b;
      for (int64_t i = r0; i < r1; ++i) {
        IO::load(p + i * C + c, a, b);
        ta += a - ka;
        tb += b - kb;
      }
      ta.store(s + c);
      tb.store(s + c + W);
    }
    for (int64_t c = vec_c; c < C; ++c)
      for (int64_t i = r0; i < r1; ++i) s[c] += static_cast<acc_t>(p[i * C + c]) - k[c];
  }
  const acc_t inv_len = acc_t(1) / static_cast<acc_t>(len);
  for (int64_t c = 0; c < C; ++c) s[c] = k[c] + s[c] * inv_len;
  // Pass 2: sum(d) and sum(d^2), d = x - centre.
  for (int64_t r0 = 0; r0 < len; r0 += kSquareRun) {
    const int64_t r1 = std::min(len, r0 + kSquareRun);
    for (int64_t c = 0; c < vec_c; c += IO::kStep) {
      const AVec ma = AVec::loadu(s + c), mb = AVec::loadu(s + c + W);
      AVec da(0), db(0), qa(0), qb(0), a, b;
      for (int64_t i = r0; i < r1; ++i) {
        IO::load(p + i * C + c, a, b);
        a -= ma;
        b -= mb;
        da += a;
        db += b;
        qa = at::vec::fmadd(a, a, qa);
        qb = at::vec::fmadd(b, b, qb);
      }
      (AVec::loadu(d + c) + da).store(d + c);
      (AVec::loadu(d + c + W) + db).store(d + c + W);
      add_widened_to(qa, q + c);
      add_widened_to(qb, q + c + W);
    }
    for (int64_t c = vec_c; c < C; ++c) {
      for (int64_t i = r0; i < r1; ++i) {
        const acc_t v = static_cast<acc_t>(p[i * C + c]) - s[c];
        d[c] += v;
        q[c] += static_cast<double>(v) * static_cast<double>(v);
      }
    }
  }
  // Chan's merge with the tile; the weights are the same for every channel, so no division per channel.
  const double inv_dl = 1.0 / static_cast<double>(len);
  const int64_t nt = m.n + len;
  const double wb = static_cast<double>(len) / static_cast<double>(nt);
  const double cross = static_cast<double>(m.n) * wb;
  double* mean = m.mean.data();
  double* m2 = m.m2.data();
  auto merge = [&](int64_t c, double tile_mean, double tile_m2) {
    const double delta = tile_mean - mean[c];
    mean[c] += delta * wb;
    m2[c] += tile_m2 + delta * (delta * cross);
  };
  if (all_float_sums_hold(s, d, q, C)) {  // the common case: a loop without branches, which vectorises
    for (int64_t c = 0; c < C; ++c) {
      double tile_mean, tile_m2;
      tile_result(inv_dl, s[c], k[c], static_cast<double>(d[c]), q[c], tile_mean, tile_m2);
      merge(c, tile_mean, tile_m2);
    }
  } else {
    for (int64_t c = 0; c < C; ++c) {
      double tile_mean, tile_m2;
      const double sd = static_cast<double>(d[c]);
      if (float_sums_hold(s[c], sd, q[c]))
        tile_result(inv_dl, s[c], k[c], sd, q[c], tile_mean, tile_m2);
      else
        wide_moments(p + c, len, C, static_cast<double>(k[c]), tile_mean, tile_m2);
      merge(c, tile_mean, tile_m2);
    }
  }
  m.n = nt;
}

template <typename scalar_t>
void stats_rows(const scalar_t* x, int64_t M, int64_t C, const acc_type<scalar_t>* k, std::vector<Moments>& out) {
  using acc_t = acc_type<scalar_t>;
  const int64_t R = std::clamp<int64_t>(kRowTileValues / std::max<int64_t>(C, 1), kMinTileRows, kMaxTileRows);
  const int64_t tiles = (M + R - 1) / R;
  const int64_t chunks = num_chunks(tiles, 1);
  std::vector<RowMoments> part(chunks, RowMoments(C));
  at::parallel_for(0, chunks, 1, [&](int64_t k0, int64_t k1) {
    RowScratch<acc_t> scratch(C);
    for (int64_t q = k0; q < k1; ++q)
      for (int64_t t = tiles * q / chunks; t < tiles * (q + 1) / chunks; ++t) {
        const int64_t r0 = t * R;
        const int64_t len = std::min(R, M - r0);
        accumulate_row_tile(x + r0 * C, len, C, k, scratch, part[q]);
      }
  });
  for (int64_t q = 0; q < chunks; ++q)
    for (int64_t c = 0; c < C; ++c) out[c].merge(part[q].n, part[q].mean[c], part[q].m2[c]);
}

// stats_rows with G rows at a time (layout.h's row_group: full vector steps), then the M % G rows left. The G copies
// of a channel share its shift, so their moments merge as they are.
template <typename scalar_t>
void stats_grouped_rows(const scalar_t* x, int64_t M, int64_t C, const std::vector<acc_type<scalar_t>>& k,
                        std::vector<Moments>& out) {
  const int64_t G = row_group(C, VecIO<scalar_t>::kStep), grouped = M / G * G;
  if (G == 1) {
    stats_rows(x, M, C, k.data(), out);
    return;
  }
  if (grouped > 0) {
    std::vector<Moments> wide(G * C);
    stats_rows(x, M / G, G * C, repeat_channels(k, G).data(), wide);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t c = 0; c < C; ++c) out[c].merge(wide[g * C + c]);
  }
  if (grouped < M) stats_rows(x + grouped * C, M - grouped, C, k.data(), out);
}

}  // namespace

at::Tensor batch_norm_stats(const at::Tensor& input) {
  const InputLayout lay = check_input(input, "batch_norm_stats");
  const int64_t C = lay.c;
  std::vector<Moments> moments(C);
  std::vector<double> shift(C, 0.0);
  if (input.numel() > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, input.scalar_type(), "syncbn_stats", [&] {
      using acc_t = acc_type<scalar_t>;
      const scalar_t* x = input.const_data_ptr<scalar_t>();
      // Each channel's shift K: its first value (sample 0, first spatial position).
      std::vector<acc_t> k(C);
      const int64_t k_stride = lay.layout == Layout::kPlanes ? lay.s : 1;
      for (int64_t c = 0; c < C; ++c) {
        k[c] = static_cast<acc_t>(x[c * k_stride]);
        shift[c] = static_cast<double>(k[c]);
      }
      if (lay.layout == Layout::kPlanes)
        stats_planes(x, lay, k.data(), moments);
      else
        stats_grouped_rows(x, lay.rows(), C, k, moments);
    });
  }
  at::Tensor out = at::zeros({2 * C + 1}, input.options().dtype(at::kDouble));
  double* o = out.data_ptr<double>();
  o[0] = C > 0 ? static_cast<double>(input.numel() / C) : 0.0;
  for (int64_t c = 0; c < C; ++c) {
    o[1 + c] = moments[c].n > 0 ? shift[c] + moments[c].mean : 0.0;
    o[1 + C + c] = moments[c].m2;
  }
  return out;
}

}  // namespace syncbn::cpu
