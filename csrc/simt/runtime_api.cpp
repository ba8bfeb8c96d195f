// The emulated host runtime: cudaGetLastError and friends, cudaDeviceGetAttribute on the emulated
// device, cudaFuncSetAttribute, the launch configuration check, the launch log and the work counters.
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "device_props.h"
#include "executor.h"
#include "runtime_state.h"

namespace syncbn::simt {
namespace {

struct Counters {
  std::atomic<int64_t> launches{0}, blocks{0}, threads{0}, switches{0};
};
Counters& counters() {
  static Counters c;
  return c;
}

struct LaunchLog {
  std::mutex mutex;
  bool enabled = false;
  std::vector<LaunchRecord> records;
};
LaunchLog& launch_log() {
  static LaunchLog log;
  return log;
}

struct LastError {
  cudaError_t code = cudaSuccess;
  std::string detail = "no error";
};
thread_local LastError tls_last_error;

std::mutex& optin_mutex() {
  static std::mutex m;
  return m;
}
std::map<const void*, int>& dynamic_smem_optin() {
  static std::map<const void*, int> m;
  return m;
}

std::mutex& names_mutex() {
  static std::mutex m;
  return m;
}
std::map<const void*, std::string>& kernel_names() {
  static std::map<const void*, std::string> m;
  return m;
}

}  // namespace

namespace detail {

void set_last_error(cudaError_t code, std::string detail) {
  tls_last_error.code = code;
  tls_last_error.detail = std::move(detail);
}

std::string triple(uint3 v) {
  return "(" + std::to_string(v.x) + ", " + std::to_string(v.y) + ", " + std::to_string(v.z) + ")";
}

std::string check_configuration(const KernelLaunch& k, dim3 grid, dim3 block, size_t shmem, cudaError_t* code) {
  const DeviceProps d = current_device();
  std::ostringstream s;
  const uint3 b = block, g = grid;
  const char* axis[3] = {"x", "y", "z"};
  const unsigned bd[3] = {b.x, b.y, b.z};
  const unsigned gd[3] = {g.x, g.y, g.z};
  *code = cudaErrorInvalidConfiguration;
  for (int i = 0; i < 3; ++i) {
    if (bd[i] == 0 || bd[i] > unsigned(d.max_block_dim[i])) {
      s << "blockDim." << axis[i] << " = " << bd[i] << ", the device allows 1.." << d.max_block_dim[i];
      return s.str();
    }
    if (gd[i] == 0 || int64_t(gd[i]) > d.max_grid_dim[i]) {
      s << "gridDim." << axis[i] << " = " << gd[i] << ", the device allows 1.." << d.max_grid_dim[i];
      return s.str();
    }
  }
  const int64_t threads = int64_t(b.x) * b.y * b.z;
  if (threads > d.max_threads_per_block) {
    s << "block " << triple(b) << " has " << threads << " threads, the device allows " << d.max_threads_per_block;
    return s.str();
  }
  int64_t limit = d.shared_mem_per_block;
  {
    std::lock_guard<std::mutex> lock(optin_mutex());
    auto it = dynamic_smem_optin().find(k.key);
    if (it != dynamic_smem_optin().end()) limit = it->second;
  }
  if (int64_t(shmem) > limit) {
    *code = cudaErrorInvalidValue;
    s << shmem << " bytes of dynamic shared memory, the kernel may use " << limit
      << (limit == d.shared_mem_per_block ? " (more needs cudaFuncSetAttribute(MaxDynamicSharedMemorySize))" : "");
    return s.str();
  }
  *code = cudaSuccess;
  return {};
}

void log_launch(const KernelLaunch& k, dim3 grid, dim3 block, size_t shmem, bool started) {
  LaunchLog& log = launch_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  if (log.enabled) log.records.push_back(LaunchRecord{k.name, grid, block, shmem, started});
}

void count_launch(int64_t blocks, int64_t threads, int64_t switches) {
  Counters& c = counters();
  c.launches.fetch_add(1, std::memory_order_relaxed);
  c.blocks.fetch_add(blocks, std::memory_order_relaxed);
  c.threads.fetch_add(threads, std::memory_order_relaxed);
  c.switches.fetch_add(switches, std::memory_order_relaxed);
}

std::string kernel_name_from_signature(const char* pretty_function) {
  std::string s(pretty_function);
  auto pos = s.find("Kernel = ");
  if (pos == std::string::npos) return s;
  s = s.substr(pos + 9);
  const auto end = s.find_last_of(']');
  if (end != std::string::npos) s = s.substr(0, end);
  if (!s.empty() && s[0] == '&') s = s.substr(1);
  // Drop the namespaces in front of the kernel's own name (not those inside its template arguments).
  const auto open = s.find('<');
  const auto last_colons = s.rfind("::", open == std::string::npos ? std::string::npos : open);
  if (last_colons != std::string::npos) s = s.substr(last_colons + 2);
  return s;
}

cudaError_t func_set_attribute(const void* kernel, cudaFuncAttribute attr, int value) {
  const DeviceProps d = current_device();
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > d.shared_mem_per_block_optin) {
    set_last_error(cudaErrorInvalidValue, "cudaFuncSetAttribute(" + std::to_string(int(attr)) + ", " +
                   std::to_string(value) + "): the device allows up to " +
                   std::to_string(d.shared_mem_per_block_optin) + " bytes of dynamic shared memory per block");
    return cudaErrorInvalidValue;
  }
  std::lock_guard<std::mutex> lock(optin_mutex());
  dynamic_smem_optin()[kernel] = value;
  return cudaSuccess;
}

const char* last_error_detail() { return tls_last_error.detail.c_str(); }

bool register_kernel_name(const void* kernel, const char* name) {
  std::lock_guard<std::mutex> lock(names_mutex());
  kernel_names()[kernel] = name;
  return true;
}

std::string registered_name(const void* kernel) {
  std::lock_guard<std::mutex> lock(names_mutex());
  auto it = kernel_names().find(kernel);
  return it != kernel_names().end() ? it->second : std::string();
}

cudaError_t func_attributes(cudaFuncAttributes* attr, const void* kernel) {
  if (attr == nullptr) {
    set_last_error(cudaErrorInvalidValue, "cudaFuncGetAttributes: no attributes to fill");
    return cudaErrorInvalidValue;
  }
  const DeviceProps d = current_device();
  *attr = cudaFuncAttributes{};
  attr->numRegs = kernel_registers(d, registered_name(kernel));
  attr->maxThreadsPerBlock = d.max_threads_per_block;
  return cudaSuccess;
}

// The occupancy calculator's arithmetic (CUDA's cuda_occupancy.h), without the per-architecture
// details that do not bound a 256-thread block: warps, registers per warp rounded up to 256, shared
// memory per block including the runtime's reserved share.
cudaError_t occupancy(int* blocks, const void* kernel, int block_threads, size_t dynamic_smem) {
  const DeviceProps d = current_device();
  if (blocks == nullptr || block_threads <= 0 || block_threads > d.max_threads_per_block) {
    set_last_error(cudaErrorInvalidValue, "cudaOccupancyMaxActiveBlocksPerMultiprocessor: block of " +
                   std::to_string(block_threads) + " threads, the device allows 1.." +
                   std::to_string(d.max_threads_per_block));
    return cudaErrorInvalidValue;
  }
  const std::string name = registered_name(kernel);
  const int64_t warps = (block_threads + d.warp_size - 1) / d.warp_size;
  const int64_t registers = kernel_registers(d, name);
  const int64_t registers_per_warp = (registers * d.warp_size + 255) / 256 * 256;
  const int64_t by_threads = d.max_threads_per_sm / d.warp_size / warps;
  const int64_t by_registers = d.registers_per_sm / registers_per_warp / warps;
  const int64_t smem = int64_t(dynamic_smem) + d.reserved_shared_mem_per_block;
  const int64_t by_smem = smem > 0 ? d.shared_mem_per_sm / smem : d.max_blocks_per_sm;
  *blocks = int(std::min({by_threads, by_registers, by_smem, int64_t(d.max_blocks_per_sm)}));
  return cudaSuccess;
}

}  // namespace detail

void record_launches(bool enabled) {
  LaunchLog& log = launch_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  log.enabled = enabled;
  log.records.clear();
}

std::vector<LaunchRecord> take_launch_records() {
  LaunchLog& log = launch_log();
  std::lock_guard<std::mutex> lock(log.mutex);
  std::vector<LaunchRecord> out;
  out.swap(log.records);
  return out;
}

std::vector<std::pair<std::string, int64_t>> execution_counters() {
  const Counters& c = counters();
  return {{"launches", c.launches.load()}, {"blocks", c.blocks.load()}, {"threads", c.threads.load()},
          {"fiber_switches", c.switches.load()}};
}

}  // namespace syncbn::simt

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int /*device*/) {
  const syncbn::simt::DeviceProps d = syncbn::simt::current_device();
  auto clamp = [](int64_t v) { return int(std::min<int64_t>(v, INT32_MAX)); };
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = d.max_threads_per_block; break;
    case cudaDevAttrMaxBlockDimX: *value = d.max_block_dim[0]; break;
    case cudaDevAttrMaxBlockDimY: *value = d.max_block_dim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *value = d.max_block_dim[2]; break;
    case cudaDevAttrMaxGridDimX: *value = clamp(d.max_grid_dim[0]); break;
    case cudaDevAttrMaxGridDimY: *value = clamp(d.max_grid_dim[1]); break;
    case cudaDevAttrMaxGridDimZ: *value = clamp(d.max_grid_dim[2]); break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = clamp(d.shared_mem_per_block); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = clamp(d.shared_mem_per_block_optin); break;
    case cudaDevAttrWarpSize: *value = d.warp_size; break;
    case cudaDevAttrMultiProcessorCount: *value = d.sm_count; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = d.max_threads_per_sm; break;
    case cudaDevAttrComputeCapabilityMajor: *value = d.cc_major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = d.cc_minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = clamp(d.shared_mem_per_sm); break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = d.registers_per_sm; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = d.max_blocks_per_sm; break;
    case cudaDevAttrReservedSharedMemoryPerBlock: *value = clamp(d.reserved_shared_mem_per_block); break;
    default:
      syncbn::simt::detail::set_last_error(cudaErrorInvalidValue,
                                   "cudaDeviceGetAttribute: attribute " + std::to_string(int(attr)) + " is not emulated");
      return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = syncbn::simt::tls_last_error.code;
  syncbn::simt::tls_last_error.code = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return syncbn::simt::tls_last_error.code; }

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}
