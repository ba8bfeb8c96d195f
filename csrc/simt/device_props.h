// The emulated device's properties: what cudaDeviceGetAttribute reports and what a launch is checked
// against. Presets copy real parts; any field can be overridden, so a test picks the SM count that
// makes a launch branch reachable at a size the CPU can afford.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace syncbn::simt {

struct DeviceProps {
  std::string name = "h100";
  int sm_count = 132;
  int max_threads_per_sm = 2048;
  int max_threads_per_block = 1024;
  int max_block_dim[3] = {1024, 1024, 64};
  int64_t max_grid_dim[3] = {2147483647, 65535, 65535};
  int64_t shared_mem_per_block = 48 * 1024;         // without the opt-in attribute
  int64_t shared_mem_per_block_optin = 227 * 1024;  // the most a kernel may opt in to
  int warp_size = 32;
  int cc_major = 9;
  int cc_minor = 0;
  // What bounds the resident blocks per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor, modelled in
  // runtime_api.cpp) besides max_threads_per_sm.
  int registers_per_sm = 65536;
  int max_blocks_per_sm = 32;
  int64_t shared_mem_per_sm = 228 * 1024;
  int64_t reserved_shared_mem_per_block = 1024;  // the runtime's own share of each block's shared memory
  // Registers per thread of a kernel: the compiler's choice on a GPU, a parameter here. 32 lets
  // max_threads_per_sm / 256 blocks of 256 threads fit (registers never the limit), as if unbounded;
  // kernel_registers overrides it for kernels whose name (as the launch log spells it, e.g.
  // "stats_channels_last_kernel<float, 4>") starts with the prefix, the longest matching prefix winning.
  int registers_per_thread = 32;
  std::vector<std::pair<std::string, int>> kernel_registers;
};

// Registers per thread the emulated device assumes for the kernel named `kernel`.
int kernel_registers(const DeviceProps& props, const std::string& kernel);

// Parses "preset[,key=value...]" or "key=value,..." (on top of h100). Presets: h100 (= h200: 132
// SMs), a100 (108 SMs), orin (16 SMs x 1536 threads: Jetson AGX Orin). Keys are the field names above
// (max_block_dim_x/y/z, max_grid_dim_x/y/z for the arrays), and registers.PREFIX=N for one entry of
// kernel_registers (e.g. "h100,registers.stats_channels_last_kernel=112": those kernels fit 2 blocks of
// 256 threads per SM; a prefix may hold template arguments, whose commas do not separate items:
// "registers.stats_channels_last_kernel<c10::BFloat16, 8>=112"). Raises c10::Error on anything else.
DeviceProps parse_device(const std::string& spec);

// The device launches use now: SYNCTRAIN_SIMT_DEVICE at first use (default h100), then set_device().
DeviceProps current_device();
void set_device(const DeviceProps& props);

// (name, value) of every numeric field (not kernel_registers), for Python and for error messages.
std::vector<std::pair<std::string, int64_t>> device_fields(const DeviceProps& props);

}  // namespace syncbn::simt
