// Input validation and layout classification shared by the CPU ops.
#include "layout.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>

#include <numeric>

#include "../checks.h"

namespace syncbn::cpu::detail {

InputLayout check_input(const at::Tensor& input, const char* op) {
  TORCH_CHECK(input.defined(), op, ": input is undefined");
  TORCH_CHECK(input.device().is_cpu(), op, ": the CPU kernel got a tensor on ", input.device());
  InputLayout lay;
  lay.format = checks::input_format(input, op);
  lay.n = input.size(0);
  lay.c = input.size(1);
  lay.s = 1;
  for (int64_t d = 2; d < input.dim(); ++d) lay.s *= input.size(d);
  lay.layout = lay.format == at::MemoryFormat::Contiguous && lay.s != 1 ? Layout::kPlanes : Layout::kRows;
  return lay;
}

void check_like_input(const at::Tensor& t, const at::Tensor& input, const InputLayout& lay,
                      const char* op, const char* name) {
  checks::like_input(t, input, lay.format, op, name);
}

void check_vector(const at::Tensor& t, int64_t numel, const char* op, const char* name,
                  const char* what) {
  checks::vector(t, numel, at::Device(at::kCPU), op, name, what);
}

std::vector<double> to_double_vector(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  const double* p = d.data_ptr<double>();
  return std::vector<double>(p, p + d.numel());
}

at::Tensor empty_like_input(const at::Tensor& input, const InputLayout& lay) {
  // Preserve copies a dense input's exact strides (so channels_last stays channels_last even where
  // the format is ambiguous: C == 1, H == W == 1, empty); fall back to the format we interpreted.
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Preserve);
  if (!out.is_contiguous(lay.format)) out = at::empty_like(input, lay.format);
  return out;
}

int64_t num_chunks(int64_t units, int64_t min_units_per_chunk) {
  const int64_t by_size = std::max<int64_t>(1, units / std::max<int64_t>(1, min_units_per_chunk));
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), by_size));
}

int64_t row_group(int64_t C, int64_t step) {
  if (C <= 0) return 1;
  const int64_t group = step / std::gcd(C, step);
  return group * C <= kMaxGroupedChannels ? group : 1;
}

}  // namespace syncbn::cpu::detail
