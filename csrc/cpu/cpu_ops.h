// The syncbn::cpu declarations of csrc/syncbn.h, with only the ATen core headers.
//
// Why a second declaration: csrc/syncbn.h includes <torch/extension.h> (pybind11, all of libtorch's
// API), which costs ~30 s of compile time per translation unit. The kernel files include this light
// header instead. A signature drift from csrc/syncbn.h cannot pass silently: bindings.cpp calls the
// contract's declarations, so the library would miss those symbols and fail to import.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace syncbn::cpu {
at::Tensor batch_norm_stats(const at::Tensor& input);
std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_gather_stats(
    const at::Tensor& gathered, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    double momentum, double eps, bool acc_double);
at::Tensor batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                            const at::Tensor& invstd);
at::Tensor batch_norm_backward_reduce(const at::Tensor& grad_out, const at::Tensor& input,
                                      const at::Tensor& mean, const at::Tensor& invstd);
at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input,
                                     const at::Tensor& mean, const at::Tensor& invstd,
                                     const std::optional<at::Tensor>& weight,
                                     const at::Tensor& reduced, const at::Tensor& count);
}  // namespace syncbn::cpu
