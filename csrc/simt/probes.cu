// Probe kernels for the emulator's tests (see probes.h). Written as CUDA, through the same
// csrc/cuda/runtime.cuh surface as the SyncBN kernels; compiled only into the emulated build.
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <map>
#include <vector>

#include "../cuda/runtime.cuh"
#include "device_memory.h"
#include "probes.h"

namespace syncbn::simt::probes {
namespace {

dim3 to_dim3(const std::vector<int64_t>& v, const char* what) {
  TORCH_CHECK(v.size() == 3, what, " must have 3 entries (x, y, z), got ", v.size());
  for (int64_t d : v) TORCH_CHECK(d >= 0 && d <= UINT32_MAX, what, " entries must fit in 32 bits, got ", d);
  return dim3(unsigned(v[0]), unsigned(v[1]), unsigned(v[2]));
}

void check_launch() { C10_CUDA_KERNEL_LAUNCH_CHECK(); }

__global__ void indices_kernel(SYNCBN_PTR(int64_t) out) {
  const int64_t block = blockIdx.x + int64_t(gridDim.x) * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z);
  const int64_t threads = int64_t(blockDim.x) * blockDim.y * blockDim.z;
  const int64_t t = threadIdx.x + int64_t(blockDim.x) * (threadIdx.y + int64_t(blockDim.y) * threadIdx.z);
  const auto row = out + (block * threads + t) * 12;
  const unsigned v[12] = {threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z,
                          blockDim.x,  blockDim.y,  blockDim.z,  gridDim.x,  gridDim.y,  gridDim.z};
  for (int i = 0; i < 12; ++i) row[i] = v[i];
}

__global__ void barrier_kernel(SYNCBN_PTR(int64_t) out, int rounds, int64_t seed) {
  __shared__ int64_t slots[1024];
  const int n = int(blockDim.x);
  const int tid = int(threadIdx.x);
  for (int r = 0; r < rounds; ++r) {
    slots[tid] = seed * (r + 1) + 1000 * int64_t(blockIdx.x) + tid;
    __syncthreads();
    out[(int64_t(blockIdx.x) * n + tid) * rounds + r] = slots[(tid + n - 1) % n];
    __syncthreads();
  }
}

enum Mode { kIdx, kUp, kDown, kXor };

template <typename T>
__global__ void shuffle_kernel(SYNCBN_PTR(const T) values, SYNCBN_PTR(T) out, SYNCBN_PTR(const int64_t) masks,
                               int mode, int lane_arg, int width) {
  const int t = int(threadIdx.x);
  const unsigned mask = unsigned(masks[t]);
  if (mask == 0) return;
  const T v = values[t];
  T r = v;
  switch (mode) {
    case kIdx: r = __shfl_sync(mask, v, lane_arg, width); break;
    case kUp: r = __shfl_up_sync(mask, v, unsigned(lane_arg), width); break;
    case kDown: r = __shfl_down_sync(mask, v, unsigned(lane_arg), width); break;
    case kXor: r = __shfl_xor_sync(mask, v, lane_arg, width); break;
  }
  out[t] = r;
}

__global__ void atomic_kernel(SYNCBN_PTR(int64_t) count, SYNCBN_PTR(double) total) {
  atomicAdd(reinterpret_cast<unsigned long long*>(&count[0]), 1ull);
  atomicAdd(&total[0], 0.5);
}

__global__ void dynamic_shared_kernel(SYNCBN_PTR(int64_t) out, int64_t index) {
  const auto smem = simt::dynamic_shared<int64_t>();
  const int n = int(blockDim.x);
  const int tid = int(threadIdx.x);
  const int64_t row = (int64_t(blockIdx.x) * n + tid) * 2;
  out[row] = smem[tid];  // nobody wrote it yet
  __syncthreads();
  smem[tid] = 1000 * int64_t(blockIdx.x) + tid;
  __syncthreads();
  out[row + 1] = smem[(tid + 1) % n];
  if (index >= 0 && tid == 0) out[row] = smem[index];
}

__global__ void static_shared_kernel(SYNCBN_PTR(int64_t) out) {
  __shared__ int64_t slots[1024];
  const int n = int(blockDim.x);
  const int tid = int(threadIdx.x);
  const int64_t row = (int64_t(blockIdx.x) * n + tid) * 2;
  out[row] = slots[tid];  // nobody in this block wrote it yet: poison, whatever an earlier block left
  __syncthreads();
  slots[tid] = 1000 * int64_t(blockIdx.x) + tid;
  __syncthreads();
  out[row + 1] = slots[(tid + 1) % n];
}

// --- races: each kernel has a correct form (fixed != 0) and the form with the synchronisation removed --

// Each thread stores its value, then reads its left neighbour's (thread 0 its own). Without the barrier
// the result is right only when every thread runs after its left neighbour (the forward order).
__global__ void race_syncthreads_kernel(SYNCBN_PTR(int64_t) out, int fixed) {
  __shared__ int64_t slots[1024];
  const int tid = int(threadIdx.x);
  slots[tid] = 100 + tid;
  if (fixed) __syncthreads();
  out[tid] = slots[tid > 0 ? tid - 1 : 0];
}

// Lanes of one warp store their values, lane 0 sums them. Without __syncwarp the sum is right only when
// lane 0 runs last (the reverse order).
__global__ void race_syncwarp_kernel(SYNCBN_PTR(int64_t) out, int fixed) {
  __shared__ int64_t slots[32];
  const int lane = int(threadIdx.x);
  slots[lane] = 100 + lane;
  if (fixed) __syncwarp();
  if (lane == 0) {
    int64_t sum = 0;
    for (int i = 0; i < 32; ++i) sum += slots[i];
    out[0] = sum;
  }
}

// Like race_syncwarp_kernel, but the buggy form puts a shuffle (lane 0's count broadcast to the warp)
// where the __syncwarp belongs. A shuffle exchanges registers and orders no memory (only __syncwarp and
// __syncthreads do, as compute-sanitizer's racecheck holds too), so the other lanes' stores are not
// ordered before lane 0's reads. The emulator runs a shuffle as a rendezvous of its lanes, so the sum
// comes out right in every order: only the race detector sees this bug.
__global__ void race_shuffle_kernel(SYNCBN_PTR(int64_t) out, int fixed) {
  __shared__ int64_t slots[32];
  const int lane = int(threadIdx.x);
  slots[lane] = 100 + lane;
  int count = 32;
  if (fixed)
    __syncwarp();
  else
    count = __shfl_sync(0xffffffffu, count, 0);
  if (lane == 0) {
    int64_t sum = 0;
    for (int i = 0; i < count; ++i) sum += slots[i];
    out[0] = sum;
  }
}

// Each warp reduces its lanes with shuffles and lane 0 stores the warp's sum; the last warp then adds
// the warps' sums. Without the __syncthreads that is right only when the last warp runs last.
__global__ void race_last_warp_kernel(SYNCBN_PTR(int64_t) out, int fixed) {
  __shared__ int64_t partial[32];
  const int tid = int(threadIdx.x);
  const int warps = int(blockDim.x) / 32;
  int64_t v = 100 + tid;
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (tid % 32 == 0) partial[tid / 32] = v;
  if (fixed) __syncthreads();
  if (tid == int(blockDim.x) - 32) {
    int64_t sum = 0;
    for (int w = 0; w < warps; ++w) sum += partial[w];
    out[0] = sum;
  }
}

// Each thread takes a ticket: the order in which the emulator ran the threads.
__global__ void order_kernel(SYNCBN_PTR(int64_t) out, SYNCBN_PTR(int64_t) ticket) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  out[t] = int64_t(atomicAdd(reinterpret_cast<unsigned long long*>(&ticket[0]), 1ull));
}

// Every thread writes its own element; without the fix, every thread writes element 0.
__global__ void race_global_write_kernel(SYNCBN_PTR(int64_t) out, int fixed) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  out[fixed ? t : 0] = t;
}

__global__ void ran_kernel(SYNCBN_PTR(int64_t) ran) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 && blockIdx.x == 0 && blockIdx.y == 0 &&
      blockIdx.z == 0)
    ran[0] = 1;
}

__global__ void iota_kernel(SYNCBN_PTR(int64_t) out) { out[threadIdx.x] = threadIdx.x; }

// --- kernels with one bug each ------------------------------------------------------------------------

__global__ void read_kernel(SYNCBN_PTR(const float) x, SYNCBN_PTR(float) y, int64_t i) { y[0] = x[i]; }

__global__ void write_kernel(SYNCBN_PTR(float) y, int64_t i) { y[i] = 1.0f; }

struct alignas(16) Float4 {
  float v[4];
};

__global__ void vector_read_kernel(SYNCBN_PTR(const float) x, SYNCBN_PTR(float) y, int64_t i) {
  y[0] = simt::device_load<Float4>(x + i).v[0];
}

__global__ void divergent_barrier_kernel() {
  if (threadIdx.x < 16)
    __syncthreads();
  else
    __syncthreads();
}

__global__ void barrier_after_return_kernel() {
  if (threadIdx.x == 0) return;
  __syncthreads();
}

__global__ void shuffle_mask_kernel(SYNCBN_PTR(float) y, unsigned low_mask, unsigned high_mask, int lane_mask,
                                    int width, int returning_lane) {
  const int lane = int(threadIdx.x) % 32;
  if (lane == returning_lane) return;
  const unsigned mask = lane < 16 ? low_mask : high_mask;
  if (mask == 0) return;
  y[threadIdx.x] = __shfl_xor_sync(mask, float(lane), lane_mask, width);
}

__global__ void deadlock_kernel(SYNCBN_PTR(float) y) {
  if (threadIdx.x == 31) {
    __syncthreads();
  } else {
    y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  }
}

using FaultFn = void (*)();

const std::map<std::string, FaultFn>& faults() {
  static const std::map<std::string, FaultFn> table = {
      {"out_of_bounds_read",
       [] {
         at::Tensor x = at::zeros({8}), y = at::zeros({1});
         SYNCBN_LAUNCH(dim3(1), dim3(1), 0, nullptr, read_kernel)(x.const_data_ptr<float>(), y.data_ptr<float>(), 8);
       }},
      {"out_of_bounds_write",
       [] {
         at::Tensor y = at::zeros({8});
         SYNCBN_LAUNCH(dim3(1), dim3(4), 0, nullptr, write_kernel)(y.data_ptr<float>(), -1);
       }},
      {"misaligned_vector_load",
       [] {
         at::Tensor x = at::zeros({16}), y = at::zeros({1});
         SYNCBN_LAUNCH(dim3(1), dim3(1), 0, nullptr, vector_read_kernel)(x.const_data_ptr<float>(), y.data_ptr<float>(), 1);
       }},
      {"null_pointer",
       [] {
         at::Tensor y = at::zeros({1});
         SYNCBN_LAUNCH(dim3(1), dim3(1), 0, nullptr, read_kernel)(static_cast<const float*>(nullptr), y.data_ptr<float>(), 0);
       }},
      {"host_pointer",
       [] {
         std::vector<float> host(8, 0.0f);
         at::Tensor y = at::zeros({1});
         SYNCBN_LAUNCH(dim3(1), dim3(1), 0, nullptr, read_kernel)(host.data(), y.data_ptr<float>(), 0);
       }},
      {"divergent_barrier", [] { SYNCBN_LAUNCH(dim3(1), dim3(32), 0, nullptr, divergent_barrier_kernel)(); }},
      {"barrier_after_return", [] { SYNCBN_LAUNCH(dim3(1), dim3(64), 0, nullptr, barrier_after_return_kernel)(); }},
      {"shuffle_without_own_lane",
       [] {
         at::Tensor y = at::zeros({32});
         SYNCBN_LAUNCH(dim3(1), dim3(32), 0, nullptr, shuffle_mask_kernel)(y.data_ptr<float>(), 0xfffffffeu, 0xfffffffeu, 1, 32, -1);
       }},
      {"shuffle_with_returned_lane",
       [] {
         at::Tensor y = at::zeros({32});
         SYNCBN_LAUNCH(dim3(1), dim3(32), 0, nullptr, shuffle_mask_kernel)(y.data_ptr<float>(), 0xffffffffu, 0xffffffffu, 1, 32, 7);
       }},
      {"shuffle_mask_disagreement",
       [] {
         at::Tensor y = at::zeros({32});
         SYNCBN_LAUNCH(dim3(1), dim3(32), 0, nullptr, shuffle_mask_kernel)(y.data_ptr<float>(), 0xffffffffu, 0xffff0000u, 1, 32, -1);
       }},
      {"shuffle_width",
       [] {
         at::Tensor y = at::zeros({32});
         SYNCBN_LAUNCH(dim3(1), dim3(32), 0, nullptr, shuffle_mask_kernel)(y.data_ptr<float>(), 0xffffffffu, 0xffffffffu, 1, 3, -1);
       }},
      {"shuffle_missing_lanes",
       [] {
         at::Tensor y = at::zeros({48});
         SYNCBN_LAUNCH(dim3(1), dim3(48), 0, nullptr, shuffle_mask_kernel)(y.data_ptr<float>(), 0xffffffffu, 0xffffffffu, 1, 32, -1);
       }},
      {"shuffle_source_outside_mask",
       [] {
         at::Tensor y = at::zeros({32});
         SYNCBN_LAUNCH(dim3(1), dim3(32), 0, nullptr, shuffle_mask_kernel)(y.data_ptr<float>(), 0x0000ffffu, 0u, 16, 32, -1);
       }},
      {"deadlock",
       [] {
         at::Tensor y = at::zeros({32});
         SYNCBN_LAUNCH(dim3(1), dim3(32), 0, nullptr, deadlock_kernel)(y.data_ptr<float>());
       }},
  };
  return table;
}

}  // namespace

void indices(at::Tensor& out, const std::vector<int64_t>& grid, const std::vector<int64_t>& block) {
  DeviceMemoryScope scope("probes.indices", {{"out", &out}});
  TORCH_CHECK(out.scalar_type() == at::kLong && out.is_contiguous(), "probes.indices: out must be contiguous int64");
  SYNCBN_LAUNCH(to_dim3(grid, "grid"), to_dim3(block, "block"), 0, nullptr, indices_kernel)(out.data_ptr<int64_t>());
  check_launch();
}

void barrier(at::Tensor& out, int64_t rounds, int64_t seed) {
  DeviceMemoryScope scope("probes.barrier", {{"out", &out}});
  TORCH_CHECK(out.dim() == 3 && out.size(2) == rounds && out.scalar_type() == at::kLong && out.is_contiguous(),
              "probes.barrier: out must be contiguous int64 [blocks, threads, rounds]");
  SYNCBN_LAUNCH(dim3(unsigned(out.size(0))), dim3(unsigned(out.size(1))), 0, nullptr, barrier_kernel)(
      out.data_ptr<int64_t>(), int(rounds), seed);
  check_launch();
}

void shuffle(const at::Tensor& values, at::Tensor& out, const std::string& mode, int64_t lane_arg, int64_t width,
             const at::Tensor& masks) {
  DeviceMemoryScope scope("probes.shuffle", {{"values", &values}, {"out", &out}, {"masks", &masks}});
  static const std::map<std::string, int> modes = {{"idx", kIdx}, {"up", kUp}, {"down", kDown}, {"xor", kXor}};
  TORCH_CHECK(modes.count(mode), "probes.shuffle: mode must be idx, up, down or xor, got ", mode);
  TORCH_CHECK(values.sizes() == out.sizes() && values.sizes() == masks.sizes() && values.dim() == 1 &&
                  values.scalar_type() == out.scalar_type() && masks.scalar_type() == at::kLong,
              "probes.shuffle: values, out and masks (int64) must be 1-D of one length");
  const dim3 grid(1), block(unsigned(values.numel()));
  const int m = modes.at(mode);
  switch (values.scalar_type()) {
    case at::kDouble:
      SYNCBN_LAUNCH(grid, block, 0, nullptr, shuffle_kernel<double>)(
          values.const_data_ptr<double>(), out.data_ptr<double>(), masks.const_data_ptr<int64_t>(), m, int(lane_arg), int(width));
      break;
    case at::kFloat:
      SYNCBN_LAUNCH(grid, block, 0, nullptr, shuffle_kernel<float>)(
          values.const_data_ptr<float>(), out.data_ptr<float>(), masks.const_data_ptr<int64_t>(), m, int(lane_arg), int(width));
      break;
    case at::kInt:
      SYNCBN_LAUNCH(grid, block, 0, nullptr, shuffle_kernel<int>)(
          values.const_data_ptr<int>(), out.data_ptr<int>(), masks.const_data_ptr<int64_t>(), m, int(lane_arg), int(width));
      break;
    default:
      TORCH_CHECK(false, "probes.shuffle: values must be float64, float32 or int32, got ", values.scalar_type());
  }
  check_launch();
}

void atomic_add(at::Tensor& count, at::Tensor& total, int64_t blocks, int64_t threads) {
  DeviceMemoryScope scope("probes.atomic_add", {{"count", &count}, {"total", &total}});
  TORCH_CHECK(count.scalar_type() == at::kLong && total.scalar_type() == at::kDouble,
              "probes.atomic_add: count int64, total float64");
  SYNCBN_LAUNCH(dim3(unsigned(blocks)), dim3(unsigned(threads)), 0, nullptr, atomic_kernel)(
      count.data_ptr<int64_t>(), total.data_ptr<double>());
  check_launch();
}

void dynamic_shared(at::Tensor& out, int64_t bytes, int64_t index) {
  DeviceMemoryScope scope("probes.dynamic_shared", {{"out", &out}});
  TORCH_CHECK(out.dim() == 3 && out.size(2) == 2 && out.scalar_type() == at::kLong && out.is_contiguous(),
              "probes.dynamic_shared: out must be contiguous int64 [blocks, threads, 2]");
  SYNCBN_LAUNCH(dim3(unsigned(out.size(0))), dim3(unsigned(out.size(1))), size_t(bytes), nullptr,
                dynamic_shared_kernel)(out.data_ptr<int64_t>(), index);
  check_launch();
}

void static_shared(at::Tensor& out) {
  DeviceMemoryScope scope("probes.static_shared", {{"out", &out}});
  TORCH_CHECK(out.dim() == 3 && out.size(2) == 2 && out.size(1) <= 1024 && out.scalar_type() == at::kLong &&
                  out.is_contiguous(),
              "probes.static_shared: out must be contiguous int64 [blocks, threads <= 1024, 2]");
  SYNCBN_LAUNCH(dim3(unsigned(out.size(0))), dim3(unsigned(out.size(1))), 0, nullptr, static_shared_kernel)(
      out.data_ptr<int64_t>());
  check_launch();
}

void order(at::Tensor& out, int64_t blocks, int64_t threads) {
  TORCH_CHECK(out.numel() == blocks * threads && out.scalar_type() == at::kLong && out.is_contiguous(),
              "probes.order: out must be contiguous int64 of blocks * threads");
  DeviceMemoryScope scope("probes.order", {{"out", &out}});
  at::Tensor ticket = at::zeros({1}, at::kLong);
  SYNCBN_LAUNCH(dim3(unsigned(blocks)), dim3(unsigned(threads)), 0, nullptr, order_kernel)(
      out.data_ptr<int64_t>(), ticket.data_ptr<int64_t>());
  check_launch();
}

at::Tensor race(const std::string& kind, bool fixed, int64_t threads, int64_t blocks) {
  TORCH_CHECK(threads >= 1 && threads <= 1024 && blocks >= 1, "probes.race: 1..1024 threads, >= 1 block");
  at::Tensor out = at::full({blocks * threads}, -7, at::kLong);
  DeviceMemoryScope scope("probes.race", {{"out", &out}});
  const dim3 grid{unsigned(blocks)}, block{unsigned(threads)};
  int64_t* o = out.data_ptr<int64_t>();
  if (kind == "syncthreads") {
    SYNCBN_LAUNCH(grid, block, 0, nullptr, race_syncthreads_kernel)(o, int(fixed));
  } else if (kind == "syncwarp") {
    TORCH_CHECK(threads == 32, "probes.race: the syncwarp probe is one warp (32 threads)");
    SYNCBN_LAUNCH(grid, block, 0, nullptr, race_syncwarp_kernel)(o, int(fixed));
  } else if (kind == "shuffle") {
    TORCH_CHECK(threads == 32, "probes.race: the shuffle probe is one warp (32 threads)");
    SYNCBN_LAUNCH(grid, block, 0, nullptr, race_shuffle_kernel)(o, int(fixed));
  } else if (kind == "last_warp") {
    TORCH_CHECK(threads % 32 == 0, "probes.race: the last_warp probe needs whole warps");
    SYNCBN_LAUNCH(grid, block, 0, nullptr, race_last_warp_kernel)(o, int(fixed));
  } else if (kind == "global_write") {
    SYNCBN_LAUNCH(grid, block, 0, nullptr, race_global_write_kernel)(o, int(fixed));
  } else {
    TORCH_CHECK(false, "probes.race: unknown kind '", kind, "' (syncthreads, syncwarp, shuffle, last_warp, global_write)");
  }
  check_launch();
  return out;
}

std::tuple<int64_t, std::string, bool> launch(const std::vector<int64_t>& grid, const std::vector<int64_t>& block,
                                              int64_t shmem, int64_t optin) {
  at::Tensor ran = at::zeros({1}, at::kLong);
  DeviceMemoryScope scope("probes.launch", {{"ran", &ran}});
  (void)cudaGetLastError();
  if (optin > 0) {
    const cudaError_t e = cudaFuncSetAttribute(ran_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(optin));
    if (e != cudaSuccess) return {int64_t(e), detail::last_error_detail(), false};
  }
  SYNCBN_LAUNCH(to_dim3(grid, "grid"), to_dim3(block, "block"), size_t(shmem), nullptr, ran_kernel)(
      ran.data_ptr<int64_t>());
  const cudaError_t e = cudaGetLastError();
  const bool did_run = ran.item<int64_t>() == 1;
  return {int64_t(e), e == cudaSuccess ? std::string() : std::string(detail::last_error_detail()), did_run};
}

at::Tensor half_written(int64_t n) {
  TORCH_CHECK(n >= 2 && n <= 2048, "probes.half_written: n must be in [2, 2048]");
  DeviceMemoryScope scope("probes.half_written", {});
  at::Tensor out = at::empty({n}, at::kLong);
  SYNCBN_LAUNCH(dim3(1), dim3(unsigned(n / 2)), 0, nullptr, iota_kernel)(out.data_ptr<int64_t>());
  check_launch();
  return out;
}

void fault(const std::string& kind) {
  DeviceMemoryScope scope("probes.fault", {});
  auto it = faults().find(kind);
  TORCH_CHECK(it != faults().end(), "probes.fault: unknown kind '", kind, "'");
  it->second();
  check_launch();
}

std::vector<std::string> fault_kinds() {
  std::vector<std::string> out;
  for (const auto& [name, fn] : faults()) out.push_back(name);
  return out;
}

}  // namespace syncbn::simt::probes
