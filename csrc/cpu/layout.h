// Input validation and layout classification shared by the CPU ops. Private to csrc/cpu/.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace syncbn::cpu::detail {

// How an (N, C, *) input is laid out in memory.
//  - kPlanes: contiguous NC*, i.e. N*C planes of S contiguous values each.
//  - kRows: channels innermost ([M, C] rows): channels_last, channels_last_3d, (N, C), and NC* with
//    S == 1 (same bytes as (N, C)).
enum class Layout { kPlanes, kRows };

struct InputLayout {
  Layout layout;
  at::MemoryFormat format;  // the format in which the input is contiguous
  int64_t n;                // batch size
  int64_t c;                // channels
  int64_t s;                // spatial size (product of dims 2..)
  int64_t rows() const { return n * s; }
};

// Checks `input` (>= 2 dims, CPU, float/double/bf16/half, a supported layout) and classifies it.
InputLayout check_input(const at::Tensor& input, const char* op);

// Checks that `t` (e.g. grad_out) matches the input's shape, dtype, device and memory format.
void check_like_input(const at::Tensor& t, const at::Tensor& input, const InputLayout& lay,
                      const char* op, const char* name);

// Checks a per-channel 1-D tensor of `numel` floating values on the CPU.
void check_vector(const at::Tensor& t, int64_t numel, const char* op, const char* name,
                  const char* what);

// Per-channel values (a 1-D floating tensor on the CPU) widened to double.
std::vector<double> to_double_vector(const at::Tensor& t);

// The value of a one-element CPU tensor, as a double.
double to_double(const at::Tensor& t);

// Output with input's sizes, dtype and memory format (channels_last stays channels_last).
at::Tensor empty_like_input(const at::Tensor& input, const InputLayout& lay);

// Number of chunks to split `units` of work into for at::parallel_for (>= 1).
int64_t num_chunks(int64_t units, int64_t min_units_per_chunk);

// Rows layout: how many consecutive rows of C channels the kernels walk as one row of G*C channels, so that a row is
// a whole number of vector steps of `step` values and no channel takes the scalar tail: G = step / gcd(C, step)
// (1 when C is a multiple of step; 32 for one channel with 32-value steps). Per-channel values are then repeated G
// times (repeat_channels); the M % G rows left at the end take the plain walk. G = 1 where G*C would exceed
// kMaxGroupedChannels (C > 128 with odd C, say): there the tail is at most step - 1 of over 128 channels.
constexpr int64_t kMaxGroupedChannels = 4096;
int64_t row_group(int64_t C, int64_t step);

// v repeated `times` times (per-channel values for rows grouped by row_group).
template <typename T>
std::vector<T> repeat_channels(const std::vector<T>& v, int64_t times) {
  std::vector<T> out;
  out.reserve(v.size() * static_cast<size_t>(times));
  for (int64_t t = 0; t < times; ++t) out.insert(out.end(), v.begin(), v.end());
  return out;
}

}  // namespace syncbn::cpu::detail
