// Declarations of the CUDA half of the kernel contract (csrc/syncbn.h, namespace syncbn::cuda).
//
// Why a mirror instead of including csrc/syncbn.h: that header pulls in <torch/extension.h> (pybind11 and
// the whole C++ frontend), which makes every nvcc translation unit ~8x slower to compile (measured: 1m40s
// vs 13s of CPU per file). The signatures below must stay identical to csrc/syncbn.h; a mismatch is a
// link error (undefined symbol) when the extension is imported, which tests/syncbn/test_cuda_build.py
// catches on CPU machines.
#pragma once
#include <ATen/core/Tensor.h>
#include <optional>
#include <tuple>

namespace syncbn::cuda {

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

}  // namespace syncbn::cuda
