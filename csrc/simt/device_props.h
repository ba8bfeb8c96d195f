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
};

// Parses "preset[,key=value...]" or "key=value,..." (on top of h100). Presets: h100 (= h200: 132
// SMs), a100 (108 SMs), orin (16 SMs x 1536 threads: Jetson AGX Orin). Keys are the field names above
// (max_block_dim_x/y/z, max_grid_dim_x/y/z for the arrays). Raises c10::Error on anything else.
DeviceProps parse_device(const std::string& spec);

// The device launches use now: SYNCTRAIN_SIMT_DEVICE at first use (default h100), then set_device().
DeviceProps current_device();
void set_device(const DeviceProps& props);

// (name, value) of every numeric field, for Python and for error messages.
std::vector<std::pair<std::string, int64_t>> device_fields(const DeviceProps& props);

}  // namespace syncbn::simt
