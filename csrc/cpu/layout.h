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

// Per-channel values widened to double (C is small; reading them via .to() costs nothing).
std::vector<double> to_double_vector(const at::Tensor& t);

// Output with input's sizes, dtype and memory format (channels_last stays channels_last).
at::Tensor empty_like_input(const at::Tensor& input, const InputLayout& lay);

// Number of chunks to split `units` of work into for at::parallel_for (>= 1).
int64_t num_chunks(int64_t units, int64_t min_units_per_chunk);

}  // namespace syncbn::cpu::detail
