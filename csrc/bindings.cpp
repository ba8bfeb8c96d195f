// Python bindings for the five SyncBN kernels (csrc/syncbn.h). Each op dispatches on the input's
// device here, so the Python side (src/syncbn/functions.py) never branches on it.
#include "syncbn.h"

namespace {

[[noreturn]] void no_cuda(const char* op) {
  TORCH_CHECK(false, "syncbn.", op, ": got CUDA tensors, but the SyncBN extension was built without CUDA; "
              "rebuild with CUDA available (a visible GPU) or `python -m src.syncbn.build --cuda`");
}

#ifdef SYNCBN_WITH_CUDA
#define SYNCBN_DISPATCH(op, is_cuda, ...) \
  return (is_cuda) ? syncbn::cuda::op(__VA_ARGS__) : syncbn::cpu::op(__VA_ARGS__)
#else
#define SYNCBN_DISPATCH(op, is_cuda, ...) \
  if (is_cuda) no_cuda(#op);              \
  return syncbn::cpu::op(__VA_ARGS__)
#endif

}  // namespace

namespace syncbn {

at::Tensor batch_norm_stats(const at::Tensor& input) {
  SYNCBN_DISPATCH(batch_norm_stats, input.is_cuda(), input);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_gather_stats(
    const at::Tensor& gathered, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    double momentum, double eps, bool acc_double) {
  SYNCBN_DISPATCH(batch_norm_gather_stats, gathered.is_cuda(), gathered, running_mean, running_var,
                  num_batches_tracked, momentum, eps, acc_double);
}

at::Tensor batch_norm_elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                            const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                            const at::Tensor& invstd) {
  SYNCBN_DISPATCH(batch_norm_elemt, input.is_cuda(), input, weight, bias, mean, invstd);
}

at::Tensor batch_norm_backward_reduce(const at::Tensor& grad_out, const at::Tensor& input,
                                      const at::Tensor& mean, const at::Tensor& invstd) {
  SYNCBN_DISPATCH(batch_norm_backward_reduce, input.is_cuda(), grad_out, input, mean, invstd);
}

at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input,
                                     const at::Tensor& mean, const at::Tensor& invstd,
                                     const std::optional<at::Tensor>& weight,
                                     const at::Tensor& reduced, const at::Tensor& count) {
  SYNCBN_DISPATCH(batch_norm_backward_elemt, input.is_cuda(), grad_out, input, mean, invstd, weight,
                  reduced, count);
}

}  // namespace syncbn

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.doc() = "SyncTrain SyncBatchNorm kernels (contract: csrc/syncbn.h)";
  m.def("batch_norm_stats", &syncbn::batch_norm_stats, py::arg("input"),
        "Per-channel [count, mean, M2] of the local batch (float64 [2*C+1]).");
  m.def("batch_norm_gather_stats", &syncbn::batch_norm_gather_stats, py::arg("gathered"),
        py::arg("running_mean"), py::arg("running_var"), py::arg("num_batches_tracked"),
        py::arg("momentum"), py::arg("eps"), py::arg("acc_double"),
        "Merge gathered [count, mean, M2] rows; returns (mean, invstd, count); updates running stats.");
  m.def("batch_norm_elemt", &syncbn::batch_norm_elemt, py::arg("input"), py::arg("weight"),
        py::arg("bias"), py::arg("mean"), py::arg("invstd"),
        "y = (x - mean) * invstd * weight + bias.");
  m.def("batch_norm_backward_reduce", &syncbn::batch_norm_backward_reduce, py::arg("grad_out"),
        py::arg("input"), py::arg("mean"), py::arg("invstd"),
        "Local [sum_dy, sum_dy_xhat] per channel (acc type [2*C]).");
  m.def("batch_norm_backward_elemt", &syncbn::batch_norm_backward_elemt, py::arg("grad_out"),
        py::arg("input"), py::arg("mean"), py::arg("invstd"), py::arg("weight"), py::arg("reduced"),
        py::arg("count"), "dx from the all-reduced [sum_dy, sum_dy_xhat] and the global count.");
}
