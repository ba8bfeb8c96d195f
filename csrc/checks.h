// Argument checks of the kernel ops, shared by the CPU (csrc/cpu/) and CUDA (csrc/cuda/) backends, so both
// raise the same error, in the same words, for the same input, and before any early return (an empty
// batch with a wrong-sized mean is still an error). Each backend checks the input's device itself
// first; everything else must then be on the input's device.
//
// Only checks of shapes, dtypes, devices and layouts live here. Checks of *values* (a negative count in
// the gathered rows, num_batches_tracked <= 0) need the data on the host: the CPU ops raise for them,
// the CUDA ops cannot without a device-to-host synchronisation, so they return NaN there instead.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>

namespace syncbn::checks {

// The memory format the kernels walk `input` in: contiguous (N, C, *) first, else channels_last (4-D)
// or channels_last_3d (5-D). A 2-D (N, C) input, or one with S = 1, is contiguous.
inline at::MemoryFormat input_format(const at::Tensor& input, const char* op) {
  TORCH_CHECK(input.defined(), op, ": input is undefined");
  TORCH_CHECK(input.dim() >= 2, op, ": input must have at least 2 dims (N, C, *), got a ", input.dim(),
              "-D tensor of shape ", input.sizes());
  const auto st = input.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble || st == at::kBFloat16 || st == at::kHalf, op,
              ": input dtype ", st, " is not supported; use float32, float64, bfloat16 or float16");
  if (input.is_contiguous()) return at::MemoryFormat::Contiguous;
  if (input.dim() == 4 && input.is_contiguous(at::MemoryFormat::ChannelsLast)) return at::MemoryFormat::ChannelsLast;
  if (input.dim() == 5 && input.is_contiguous(at::MemoryFormat::ChannelsLast3d))
    return at::MemoryFormat::ChannelsLast3d;
  TORCH_CHECK(false, op, ": input of shape ", input.sizes(), " has strides ", input.strides(),
              ", which is neither contiguous nor channels_last/channels_last_3d; call "
              ".contiguous() (or .contiguous(memory_format=torch.channels_last)) first");
}

// `t` (grad_out) must have the input's shape, dtype, device and memory format.
inline void like_input(const at::Tensor& t, const at::Tensor& input, at::MemoryFormat format, const char* op,
                       const char* name) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK(t.device() == input.device(), op, ": ", name, " is on ", t.device(), " but input is on ",
              input.device());
  TORCH_CHECK(t.sizes() == input.sizes(), op, ": ", name, " has shape ", t.sizes(), " but input has shape ",
              input.sizes());
  TORCH_CHECK(t.scalar_type() == input.scalar_type(), op, ": ", name, " dtype ", t.scalar_type(),
              " does not match input dtype ", input.scalar_type());
  TORCH_CHECK(t.is_contiguous(format), op, ": ", name, " (strides ", t.strides(),
              ") must have the input's memory format (", format, ", strides ", input.strides(),
              "); call .contiguous(memory_format=...) on it first");
}

// A 1-D floating-point tensor of `numel` values on `device`.
inline void vector(const at::Tensor& t, int64_t numel, at::Device device, const char* op, const char* name,
                   const char* what) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK(t.device() == device, op, ": ", name, " is on ", t.device(), " but input is on ", device);
  TORCH_CHECK(t.dim() == 1 && t.numel() == numel, op, ": ", name, " must be a 1-D tensor of ", numel, " values (",
              what, "), got shape ", t.sizes());
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), op, ": ", name, " must be floating point, got ",
              t.scalar_type());
}

// backward_elemt's global element count: one value on `device`.
inline void count(const at::Tensor& count, at::Device device, const char* op) {
  TORCH_CHECK(count.defined() && count.numel() == 1, op,
              ": count must be a tensor holding one value (the global element count per channel)");
  TORCH_CHECK(count.device() == device, op, ": count is on ", count.device(), " but input is on ", device);
}

// gather_stats' rows: float64 [world_size, 2*C+1]; returns C.
inline int64_t gathered_rows(const at::Tensor& gathered, const char* op) {
  TORCH_CHECK(gathered.scalar_type() == at::kDouble, op, ": gathered must be float64, got ", gathered.scalar_type());
  TORCH_CHECK(gathered.dim() == 2 && gathered.size(1) % 2 == 1, op,
              ": gathered must have shape [world_size, 2*C+1] (rows of [count, mean_0..C-1, m2_0..C-1]), got ",
              gathered.sizes());
  return (gathered.size(1) - 1) / 2;
}

// batch_norm_stats' packed row: float64 [2*C+1] = [count, mean(C), M2(C)]; returns C.
inline int64_t packed_stats(const at::Tensor& stats, const char* op) {
  TORCH_CHECK(stats.defined() && stats.scalar_type() == at::kDouble && stats.dim() == 1 && stats.numel() % 2 == 1,
              op, ": stats must be a float64 1-D tensor of 2*C+1 values ([count, mean(C), M2(C)]), got ",
              stats.defined() ? c10::toString(stats.scalar_type()) : "undefined", " ",
              stats.defined() ? stats.sizes() : at::IntArrayRef{});
  return (stats.numel() - 1) / 2;
}

// The all-reduced batch_norm_mean_sums: float64 [C+1] = [count, sum n*mean(C)] on `device`.
inline void mean_sums(const at::Tensor& sums, int64_t C, at::Device device, const char* op, const char* other) {
  TORCH_CHECK(sums.defined() && sums.scalar_type() == at::kDouble && sums.dim() == 1 && sums.numel() == C + 1, op,
              ": mean_sums must be a float64 1-D tensor of C+1 = ", C + 1, " values ([count, sum n*mean(C)]), got ",
              sums.defined() ? c10::toString(sums.scalar_type()) : "undefined", " ",
              sums.defined() ? sums.sizes() : at::IntArrayRef{});
  TORCH_CHECK(sums.device() == device, op, ": mean_sums is on ", sums.device(), " but ", other, " is on ", device);
}

// reduced_stats' inputs: the all-reduced mean_sums [C+1] and M2 (float64 [C], same device); returns C.
inline int64_t reduced_m2(const at::Tensor& m2, const at::Tensor& sums, const char* op) {
  TORCH_CHECK(m2.defined() && m2.scalar_type() == at::kDouble && m2.dim() == 1, op,
              ": m2 must be a float64 1-D tensor of C values, got ",
              m2.defined() ? c10::toString(m2.scalar_type()) : "undefined", " ",
              m2.defined() ? m2.sizes() : at::IntArrayRef{});
  const int64_t C = m2.numel();
  mean_sums(sums, C, m2.device(), op, "m2");
  return C;
}

// gather_stats' running statistics (updated in place: contiguous, one dtype) and, for momentum < 0
// (cumulative average), num_batches_tracked.
inline void running_stats(const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
                          const std::optional<at::Tensor>& num_batches_tracked, double momentum, int64_t C,
                          at::Device device, const char* op) {
  const bool has_rm = running_mean.has_value() && running_mean->defined();
  const bool has_rv = running_var.has_value() && running_var->defined();
  TORCH_CHECK(has_rm == has_rv, op, ": running_mean and running_var must be given together");
  if (!has_rm) return;
  vector(*running_mean, C, device, op, "running_mean", "one per channel");
  vector(*running_var, C, device, op, "running_var", "one per channel");
  TORCH_CHECK(running_mean->is_contiguous() && running_var->is_contiguous(), op,
              ": running_mean and running_var must be contiguous (they are updated in place)");
  TORCH_CHECK(running_mean->scalar_type() == running_var->scalar_type(), op,
              ": running_mean and running_var must share a dtype, got ", running_mean->scalar_type(), " and ",
              running_var->scalar_type());
  if (momentum >= 0) return;
  TORCH_CHECK(num_batches_tracked.has_value() && num_batches_tracked->defined(), op,
              ": momentum < 0 (cumulative average) needs num_batches_tracked");
  const at::Tensor& nbt = *num_batches_tracked;
  TORCH_CHECK(nbt.scalar_type() == at::kLong && nbt.numel() == 1 && nbt.device() == device, op,
              ": num_batches_tracked must be a one-element int64 tensor on ", device, ", got ", nbt.scalar_type(), " ",
              nbt.sizes(), " on ", nbt.device());
}

}  // namespace syncbn::checks
