// Python module of the emulated build: the eight syncbn::cuda ops (csrc/cuda/, compiled by the host
// compiler against the SIMT emulation) with the same Python signatures as the real extension's, taking
// CPU tensors (host memory plays device memory), and kernel_occupancy as the real one reports it, from
// the emulated device's model; the emulated device's properties; the launch log and counters; and the
// probe kernels that test the emulator itself (csrc/simt/probes.cu).
//
// pybind.h (tensor casters) rather than <torch/extension.h>: the whole C++ frontend costs ~20 s of CPU
// per compile and nothing here uses it.
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "../cuda/occupancy.h"
#include "../cuda/reduce_probe.h"
#include "../ops.h"
#include "device_memory.h"
#include "device_props.h"
#include "executor.h"
#include "fiber.h"
#include "probes.h"
#include "schedule.h"

namespace {

using OptTensor = std::optional<at::Tensor>;

const at::Tensor* opt(const OptTensor& t) { return t.has_value() ? &*t : nullptr; }

at::Tensor batch_norm_stats(const at::Tensor& input) {
  syncbn::simt::DeviceMemoryScope scope("batch_norm_stats", {{"input", &input}});
  return syncbn::cuda::batch_norm_stats(input);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_gather_stats(
    const at::Tensor& gathered, const OptTensor& running_mean, const OptTensor& running_var,
    const OptTensor& num_batches_tracked, double momentum, double eps, bool acc_double) {
  syncbn::simt::DeviceMemoryScope scope("batch_norm_gather_stats",
                                        {{"gathered", &gathered}, {"running_mean", opt(running_mean)},
                                         {"running_var", opt(running_var)},
                                         {"num_batches_tracked", opt(num_batches_tracked)}});
  return syncbn::cuda::batch_norm_gather_stats(gathered, running_mean, running_var, num_batches_tracked, momentum,
                                               eps, acc_double);
}

at::Tensor batch_norm_mean_sums(const at::Tensor& stats) {
  syncbn::simt::DeviceMemoryScope scope("batch_norm_mean_sums", {{"stats", &stats}});
  return syncbn::cuda::batch_norm_mean_sums(stats);
}

at::Tensor batch_norm_deviation_sums(const at::Tensor& stats, const at::Tensor& mean_sums) {
  syncbn::simt::DeviceMemoryScope scope("batch_norm_deviation_sums", {{"stats", &stats}, {"mean_sums", &mean_sums}});
  return syncbn::cuda::batch_norm_deviation_sums(stats, mean_sums);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_reduced_stats(
    const at::Tensor& mean_sums, const at::Tensor& m2, const OptTensor& running_mean, const OptTensor& running_var,
    const OptTensor& num_batches_tracked, double momentum, double eps, bool acc_double) {
  syncbn::simt::DeviceMemoryScope scope("batch_norm_reduced_stats",
                                        {{"mean_sums", &mean_sums}, {"m2", &m2}, {"running_mean", opt(running_mean)},
                                         {"running_var", opt(running_var)},
                                         {"num_batches_tracked", opt(num_batches_tracked)}});
  return syncbn::cuda::batch_norm_reduced_stats(mean_sums, m2, running_mean, running_var, num_batches_tracked,
                                                momentum, eps, acc_double);
}

at::Tensor batch_norm_elemt(const at::Tensor& input, const OptTensor& weight, const OptTensor& bias,
                            const at::Tensor& mean, const at::Tensor& invstd) {
  syncbn::simt::DeviceMemoryScope scope("batch_norm_elemt", {{"input", &input}, {"weight", opt(weight)},
                                                             {"bias", opt(bias)}, {"mean", &mean},
                                                             {"invstd", &invstd}});
  return syncbn::cuda::batch_norm_elemt(input, weight, bias, mean, invstd);
}

at::Tensor batch_norm_backward_reduce(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                                      const at::Tensor& invstd) {
  syncbn::simt::DeviceMemoryScope scope("batch_norm_backward_reduce", {{"grad_out", &grad_out}, {"input", &input},
                                                                       {"mean", &mean}, {"invstd", &invstd}});
  return syncbn::cuda::batch_norm_backward_reduce(grad_out, input, mean, invstd);
}

at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                                     const at::Tensor& invstd, const OptTensor& weight, const at::Tensor& reduced,
                                     const at::Tensor& count) {
  syncbn::simt::DeviceMemoryScope scope("batch_norm_backward_elemt",
                                        {{"grad_out", &grad_out}, {"input", &input}, {"mean", &mean},
                                         {"invstd", &invstd}, {"weight", opt(weight)}, {"reduced", &reduced},
                                         {"count", &count}});
  return syncbn::cuda::batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, reduced, count);
}

pybind11::dict device_dict(const syncbn::simt::DeviceProps& p) {
  pybind11::dict d;
  d["name"] = p.name;
  for (const auto& [key, value] : syncbn::simt::device_fields(p)) d[key.c_str()] = value;
  pybind11::dict registers;
  for (const auto& [prefix, value] : p.kernel_registers) registers[prefix.c_str()] = value;
  d["kernel_registers"] = registers;
  return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  namespace simt = syncbn::simt;
  m.doc() = "SyncBN CUDA kernels (csrc/cuda) run on the CPU by a SIMT emulation; ops take CPU tensors";
  m.def("batch_norm_stats", &batch_norm_stats, py::arg("input"),
        "Per-channel [count, mean, M2] of the local batch (float64 [2*C+1]).");
  m.def("batch_norm_gather_stats", &batch_norm_gather_stats, py::arg("gathered"), py::arg("running_mean"),
        py::arg("running_var"), py::arg("num_batches_tracked"), py::arg("momentum"), py::arg("eps"),
        py::arg("acc_double"),
        "Merge gathered [count, mean, M2] rows; returns (mean, invstd, count); updates running stats.");
  m.def("batch_norm_mean_sums", &batch_norm_mean_sums, py::arg("stats"),
        "This rank's [n, mean, M2] -> [n, n*mean], the first all_reduce's payload (float64 [C+1]).");
  m.def("batch_norm_deviation_sums", &batch_norm_deviation_sums, py::arg("stats"), py::arg("mean_sums"),
        "M2 + n*(mean - global mean)^2, the second all_reduce's payload (float64 [C]).");
  m.def("batch_norm_reduced_stats", &batch_norm_reduced_stats, py::arg("mean_sums"), py::arg("m2"),
        py::arg("running_mean"), py::arg("running_var"), py::arg("num_batches_tracked"), py::arg("momentum"),
        py::arg("eps"), py::arg("acc_double"),
        "All-reduced [n, sum n*mean] and M2 -> (mean, invstd, count); updates running stats.");
  m.def("batch_norm_elemt", &batch_norm_elemt, py::arg("input"), py::arg("weight"), py::arg("bias"),
        py::arg("mean"), py::arg("invstd"), "y = (x - mean) * invstd * weight + bias.");
  m.def("batch_norm_backward_reduce", &batch_norm_backward_reduce, py::arg("grad_out"), py::arg("input"),
        py::arg("mean"), py::arg("invstd"), "Local [sum_dy, sum_dy_xhat] per channel (acc type [2*C]).");
  m.def("batch_norm_backward_elemt", &batch_norm_backward_elemt, py::arg("grad_out"), py::arg("input"),
        py::arg("mean"), py::arg("invstd"), py::arg("weight"), py::arg("reduced"), py::arg("count"),
        "dx from the all-reduced [sum_dy, sum_dy_xhat] and the global count.");

  // The same entries as the real extension's kernel_occupancy (csrc/bindings.cpp): what the emulated device's
  // occupancy model gives each kernel, with the registers per thread the device assumes for it.
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
          d["launch_name"] = syncbn::simt::detail::registered_name(k.function);  // as launches() spells it
          out.append(d);
        }
        return out;
      }, py::arg("device") = 0,
      "Resident blocks per SM of every kernel on the emulated device (its model of "
      "cudaOccupancyMaxActiveBlocksPerMultiprocessor), with the registers per thread it assumes and the "
      "kernel's name as the launch log spells it (what registers.NAME=N in the device spec matches).");
  m.def("set_device", [](const std::string& spec) { simt::set_device(simt::parse_device(spec)); },
        py::arg("spec"), "Emulate another device: 'h100', 'a100', 'orin', optionally ',key=value,...' "
        "(registers.KERNEL_PREFIX=N: that kernel's registers per thread, which bound its resident blocks).");
  m.def("device", [] { return device_dict(simt::current_device()); }, "The emulated device's properties.");
  m.def("parse_device", [](const std::string& spec) { return device_dict(simt::parse_device(spec)); },
        py::arg("spec"), "The properties a device spec describes (without switching to it).");
  m.def("set_fibers", [](const std::string& backend) {
        TORCH_CHECK(backend == "asm" || backend == "ucontext", "fibers: expected 'asm' or 'ucontext', got ", backend);
        simt::set_fiber_backend(backend == "asm" ? simt::FiberBackend::kAsm : simt::FiberBackend::kUcontext);
      }, py::arg("backend"), "Context-switch implementation of the emulated threads.");
  m.def("fibers", [] { return simt::fiber_backend() == simt::FiberBackend::kAsm ? "asm" : "ucontext"; });
  m.def("asm_fibers_available", &simt::asm_fibers_available);
  m.def("set_schedule", [](const std::optional<std::string>& spec) {
        simt::set_schedule(spec ? std::optional<simt::Schedule>(simt::parse_schedule(*spec, "set_schedule"))
                                : std::nullopt);
      }, py::arg("spec"),
        "Lane, warp and block order of the next launches: 'forward', 'reverse', 'random' or 'random:SEED'; "
        "None: SYNCTRAIN_SIMT_SCHEDULE (read per launch), else forward.");
  m.def("schedule", [] { return simt::schedule_spec(simt::current_schedule()); },
        "The schedule the next launch uses.");
  m.def("set_race_detection", &simt::set_race_detection, py::arg("enabled"),
        "Switch the shared-memory race detector and the global write-conflict check on or off.");
  m.def("race_detection", &simt::race_detection);
  m.def("record_launches", &simt::record_launches, py::arg("enabled") = true,
        "Start (or stop) logging launches; drops the log.");
  m.def("launches", [] {
        py::list out;
        for (const auto& r : simt::take_launch_records()) {
          py::dict d;
          d["kernel"] = r.kernel;
          d["grid"] = py::make_tuple(r.grid.x, r.grid.y, r.grid.z);
          d["block"] = py::make_tuple(r.block.x, r.block.y, r.block.z);
          d["shmem"] = r.shmem;
          d["started"] = r.started;
          out.append(d);
        }
        return out;
      }, "The launches logged since the last call (kernel name, grid, block, shmem, started).");
  m.def("counters", [] {
        py::dict d;
        for (const auto& [key, value] : simt::execution_counters()) d[key.c_str()] = value;
        return d;
      }, "Launches, blocks, threads and fiber switches since the process started.");
  m.def("live_allocations", &simt::allocation_count, "Registered device allocations (argument + tracked).");

  namespace probes = syncbn::simt::probes;
  auto p = m.def_submodule("probes", "Kernels that exercise the emulator itself (csrc/simt/probes.h).");
  p.def("indices", &probes::indices, py::arg("out"), py::arg("grid"), py::arg("block"));
  p.def("barrier", &probes::barrier, py::arg("out"), py::arg("rounds"), py::arg("seed"));
  p.def("shuffle", &probes::shuffle, py::arg("values"), py::arg("out"), py::arg("mode"), py::arg("lane_arg"),
        py::arg("width"), py::arg("masks"));
  p.def("atomic_add", &probes::atomic_add, py::arg("count"), py::arg("total"), py::arg("blocks"), py::arg("threads"));
  p.def("dynamic_shared", &probes::dynamic_shared, py::arg("out"), py::arg("bytes"), py::arg("index"));
  p.def("launch", &probes::launch, py::arg("grid"), py::arg("block"), py::arg("shmem") = 0, py::arg("optin") = 0);
  p.def("half_written", &probes::half_written, py::arg("n"));
  p.def("static_shared", &probes::static_shared, py::arg("out"));
  p.def("order", &probes::order, py::arg("out"), py::arg("blocks"), py::arg("threads"));
  p.def("race", &probes::race, py::arg("kind"), py::arg("fixed"), py::arg("threads"), py::arg("blocks") = 1);
  p.def("fault", &probes::fault, py::arg("kind"));
  p.def("fault_kinds", &probes::fault_kinds);
  p.def("block_reduce_sum", &syncbn::cuda::probes::block_reduce_sum, py::arg("values"), py::arg("group"));
}
