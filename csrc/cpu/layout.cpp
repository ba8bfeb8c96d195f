// Input validation and layout classification shared by the CPU ops.
#include "layout.h"

#include <ATen/Dispatch.h>
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
  // Read in place (no .to(): one small ATen call per vector and op cost more than a small layer's kernels).
  std::vector<double> out(t.numel());
  const int64_t stride = t.dim() == 1 ? t.stride(0) : 1;
  const at::Tensor dense = t.dim() == 1 ? t : t.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, t.scalar_type(), "syncbn_to_double_vector", [&] {
    const scalar_t* p = dense.const_data_ptr<scalar_t>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(p[static_cast<int64_t>(i) * stride]);
  });
  return out;
}

double to_double(const at::Tensor& t) {
  double out = 0.0;
  AT_DISPATCH_ALL_TYPES_AND2(at::kBFloat16, at::kHalf, t.scalar_type(), "syncbn_to_double",
                             [&] { out = static_cast<double>(*t.const_data_ptr<scalar_t>()); });
  return out;
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
