// The eight SyncBN kernels (csrc/syncbn.h) as PyTorch operators and as Python functions. Each op
// dispatches on the input's device here, so the Python side (src/syncbn/functions.py) never branches
// on it.
//
// Operators: TORCH_LIBRARY registers the eight ops under the namespace TORCH_EXTENSION_NAME (the
// variant's cache name, e.g. syncbn_cpu_avx512_<hash>), with schemas that declare the in-place update
// of the running statistics, for the CPU and CUDA dispatch keys. torch.compile traces them through
// the fake (meta) implementations in src/syncbn/fake_kernels.py; eager calls reach these C++
// functions through the dispatcher. A per-variant namespace lets two variants (or an emulation
// build of the same sources) live in one process without a duplicate-registration error.
//
// Python functions: the same eight, bound directly (the module's attributes), for kernel tests and
// benchmarks that call the kernels without the dispatcher.
#include "syncbn.h"
#ifdef SYNCBN_WITH_CUDA
#include "cuda/occupancy.h"
#endif

namespace {

[[noreturn]] void no_cuda(const char* op) {
  TORCH_CHECK(false, "syncbn.", op, ": got CUDA tensors, but the SyncBN extension was built without CUDA; "
              "build the CUDA variant with `python -m src.syncbn.build --cuda` where the CUDA toolkit (nvcc, "
              "CUDA_HOME) is installed, or train with norm=torch_syncbn; "
              "src.syncbn.extension.cuda_kernels_problem() says what this machine lacks");
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

at::Tensor batch_norm_mean_sums(const at::Tensor& stats) {
  SYNCBN_DISPATCH(batch_norm_mean_sums, stats.is_cuda(), stats);
}

at::Tensor batch_norm_deviation_sums(const at::Tensor& stats, const at::Tensor& mean_sums) {
  SYNCBN_DISPATCH(batch_norm_deviation_sums, stats.is_cuda(), stats, mean_sums);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_reduced_stats(
    const at::Tensor& mean_sums, const at::Tensor& m2, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    double momentum, double eps, bool acc_double) {
  SYNCBN_DISPATCH(batch_norm_reduced_stats, mean_sums.is_cuda(), mean_sums, m2, running_mean, running_var,
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

// Tags: pt2_compliant_tag (the schemas, fake implementations and aliasing are PT2-correct; checked
// by torch.library.opcheck in tests/syncbn/test_custom_ops.py); needs_exact_strides because the
// kernels take only dense contiguous or channels_last inputs, in exactly the strides they were traced
// with, so Inductor must not hand them a re-laid-out or padded buffer.
TORCH_LIBRARY(TORCH_EXTENSION_NAME, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag, at::Tag::needs_exact_strides};
  m.def("batch_norm_stats(Tensor input) -> Tensor", tags);
  m.def("batch_norm_gather_stats(Tensor gathered, Tensor(a!)? running_mean, Tensor(b!)? running_var, "
        "Tensor? num_batches_tracked, float momentum, float eps, bool acc_double) -> (Tensor, Tensor, Tensor)",
        tags);
  m.def("batch_norm_mean_sums(Tensor stats) -> Tensor", tags);
  m.def("batch_norm_deviation_sums(Tensor stats, Tensor mean_sums) -> Tensor", tags);
  m.def("batch_norm_reduced_stats(Tensor mean_sums, Tensor m2, Tensor(a!)? running_mean, Tensor(b!)? running_var, "
        "Tensor? num_batches_tracked, float momentum, float eps, bool acc_double) -> (Tensor, Tensor, Tensor)",
        tags);
  m.def("batch_norm_elemt(Tensor input, Tensor? weight, Tensor? bias, Tensor mean, Tensor invstd) -> Tensor",
        tags);
  m.def("batch_norm_backward_reduce(Tensor grad_out, Tensor input, Tensor mean, Tensor invstd) -> Tensor",
        tags);
  m.def("batch_norm_backward_elemt(Tensor grad_out, Tensor input, Tensor mean, Tensor invstd, "
        "Tensor? weight, Tensor reduced, Tensor count) -> Tensor",
        tags);
}

// The device dispatchers above serve both keys: without CUDA they raise no_cuda's message for CUDA
// tensors instead of the dispatcher's generic "could not run ... with the CUDA backend".
#define SYNCBN_IMPL_ALL(m)                                                  \
  m.impl("batch_norm_stats", &syncbn::batch_norm_stats);                     \
  m.impl("batch_norm_gather_stats", &syncbn::batch_norm_gather_stats);       \
  m.impl("batch_norm_mean_sums", &syncbn::batch_norm_mean_sums);             \
  m.impl("batch_norm_deviation_sums", &syncbn::batch_norm_deviation_sums);   \
  m.impl("batch_norm_reduced_stats", &syncbn::batch_norm_reduced_stats);     \
  m.impl("batch_norm_elemt", &syncbn::batch_norm_elemt);                     \
  m.impl("batch_norm_backward_reduce", &syncbn::batch_norm_backward_reduce); \
  m.impl("batch_norm_backward_elemt", &syncbn::batch_norm_backward_elemt)

TORCH_LIBRARY_IMPL(TORCH_EXTENSION_NAME, CPU, m) { SYNCBN_IMPL_ALL(m); }
TORCH_LIBRARY_IMPL(TORCH_EXTENSION_NAME, CUDA, m) { SYNCBN_IMPL_ALL(m); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.doc() = "SyncTrain SyncBatchNorm kernels (contract: csrc/syncbn.h)";
  // torch.ops.<ops_namespace>.<op> are the dispatcher operators registered above.
  m.attr("ops_namespace") = py::str(C10_STRINGIZE(TORCH_EXTENSION_NAME));
  m.def("batch_norm_stats", &syncbn::batch_norm_stats, py::arg("input"),
        "Per-channel [count, mean, M2] of the local batch (float64 [2*C+1]).");
  m.def("batch_norm_gather_stats", &syncbn::batch_norm_gather_stats, py::arg("gathered"),
        py::arg("running_mean"), py::arg("running_var"), py::arg("num_batches_tracked"),
        py::arg("momentum"), py::arg("eps"), py::arg("acc_double"),
        "Merge gathered [count, mean, M2] rows; returns (mean, invstd, count); updates running stats.");
  m.def("batch_norm_mean_sums", &syncbn::batch_norm_mean_sums, py::arg("stats"),
        "This rank's [n, mean, M2] -> [n, n*mean], the first all_reduce's payload (float64 [C+1]).");
  m.def("batch_norm_deviation_sums", &syncbn::batch_norm_deviation_sums, py::arg("stats"), py::arg("mean_sums"),
        "M2 + n*(mean - global mean)^2, the second all_reduce's payload (float64 [C]).");
  m.def("batch_norm_reduced_stats", &syncbn::batch_norm_reduced_stats, py::arg("mean_sums"), py::arg("m2"),
        py::arg("running_mean"), py::arg("running_var"), py::arg("num_batches_tracked"), py::arg("momentum"),
        py::arg("eps"), py::arg("acc_double"),
        "All-reduced [n, sum n*mean] and M2 -> (mean, invstd, count); updates running stats.");
  m.def("batch_norm_elemt", &syncbn::batch_norm_elemt, py::arg("input"), py::arg("weight"),
        py::arg("bias"), py::arg("mean"), py::arg("invstd"),
        "y = (x - mean) * invstd * weight + bias.");
  m.def("batch_norm_backward_reduce", &syncbn::batch_norm_backward_reduce, py::arg("grad_out"),
        py::arg("input"), py::arg("mean"), py::arg("invstd"),
        "Local [sum_dy, sum_dy_xhat] per channel (acc type [2*C]).");
  m.def("batch_norm_backward_elemt", &syncbn::batch_norm_backward_elemt, py::arg("grad_out"),
        py::arg("input"), py::arg("mean"), py::arg("invstd"), py::arg("weight"), py::arg("reduced"),
        py::arg("count"), "dx from the all-reduced [sum_dy, sum_dy_xhat] and the global count.");
#ifdef SYNCBN_WITH_CUDA
  m.def("kernel_occupancy", [](int device) {
        py::list out;
        for (const auto& k : syncbn::cuda::kernel_occupancy(device)) {
          py::dict d;
          d["kernel"] = k.kernel;
          d["block_threads"] = k.block_threads;
          d["blocks_per_sm"] = k.blocks_per_sm;
          d["max_threads_per_sm"] = k.max_threads_per_sm;
          d["occupancy"] = double(k.blocks_per_sm * k.block_threads) / double(k.max_threads_per_sm);
          d["registers"] = k.registers;
          d["local_bytes"] = k.local_bytes;
          out.append(d);
        }
        return out;
      }, py::arg("device") = 0,
      "Resident blocks per SM of every kernel on CUDA device `device` (cudaOccupancyMaxActiveBlocksPerMultiprocessor), "
      "with registers and local memory per thread.");
#endif
}
