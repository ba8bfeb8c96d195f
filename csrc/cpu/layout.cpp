// Input validation and layout classification shared by the CPU ops.
#include "layout.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>

namespace syncbn::cpu::detail {

InputLayout check_input(const at::Tensor& input, const char* op) {
  TORCH_CHECK(input.defined(), op, ": input is undefined");
  TORCH_CHECK(input.device().is_cpu(), op, ": the CPU kernel got a tensor on ", input.device());
  TORCH_CHECK(input.dim() >= 2, op, ": input must have at least 2 dims (N, C, *), got a ", input.dim(),
              "-D tensor of shape ", input.sizes());
  const auto st = input.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble || st == at::kBFloat16 || st == at::kHalf, op,
              ": input dtype ", st, " is not supported; use float32, float64, bfloat16 or float16");
  InputLayout lay;
  lay.n = input.size(0);
  lay.c = input.size(1);
  lay.s = 1;
  for (int64_t d = 2; d < input.dim(); ++d) lay.s *= input.size(d);
  if (input.is_contiguous()) {
    lay.format = at::MemoryFormat::Contiguous;
    lay.layout = lay.s == 1 ? Layout::kRows : Layout::kPlanes;
  } else if (input.dim() == 4 && input.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    lay.format = at::MemoryFormat::ChannelsLast;
    lay.layout = Layout::kRows;
  } else if (input.dim() == 5 && input.is_contiguous(at::MemoryFormat::ChannelsLast3d)) {
    lay.format = at::MemoryFormat::ChannelsLast3d;
    lay.layout = Layout::kRows;
  } else {
    TORCH_CHECK(false, op, ": input of shape ", input.sizes(), " has strides ", input.strides(),
                ", which is neither contiguous nor channels_last/channels_last_3d; call "
                ".contiguous() (or .contiguous(memory_format=torch.channels_last)) first");
  }
  return lay;
}

void check_like_input(const at::Tensor& t, const at::Tensor& input, const InputLayout& lay,
                      const char* op, const char* name) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " is on ", t.device(), " but input is on the CPU");
  TORCH_CHECK(t.sizes() == input.sizes(), op, ": ", name, " has shape ", t.sizes(),
              " but input has shape ", input.sizes());
  TORCH_CHECK(t.scalar_type() == input.scalar_type(), op, ": ", name, " dtype ", t.scalar_type(),
              " does not match input dtype ", input.scalar_type());
  TORCH_CHECK(t.is_contiguous(lay.format), op, ": ", name, " (strides ", t.strides(),
              ") must have the input's memory format (", lay.format, ", strides ", input.strides(),
              "); call .contiguous(memory_format=...) on it first");
}

void check_vector(const at::Tensor& t, int64_t numel, const char* op, const char* name,
                  const char* what) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " is on ", t.device(), " but input is on the CPU");
  TORCH_CHECK(t.dim() == 1 && t.numel() == numel, op, ": ", name, " must be a 1-D tensor of ", numel,
              " values (", what, "), got shape ", t.sizes());
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), op, ": ", name, " must be floating point, got ",
              t.scalar_type());
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

}  // namespace syncbn::cpu::detail
