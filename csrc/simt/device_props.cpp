// Device presets, the "preset,key=value" parser and the current device.
#include "device_props.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <mutex>
#include <sstream>

namespace syncbn::simt {
namespace {

const std::string kRegistersPrefix = "registers.";

DeviceProps preset(const std::string& name) {
  DeviceProps p;  // defaults: H100 SXM (an H200 has the same SMs and limits)
  if (name == "h100" || name == "h200") {
    p.name = name;
  } else if (name == "a100") {
    p.name = name;
    p.sm_count = 108;
    p.shared_mem_per_block_optin = 163 * 1024;
    p.shared_mem_per_sm = 164 * 1024;
    p.cc_major = 8;
  } else if (name == "orin") {  // Jetson AGX Orin: a small part with 1536 thread slots per SM
    p.name = name;
    p.sm_count = 16;
    p.max_threads_per_sm = 1536;
    p.max_blocks_per_sm = 16;
    p.shared_mem_per_block_optin = 163 * 1024;
    p.shared_mem_per_sm = 164 * 1024;
    p.cc_major = 8;
    p.cc_minor = 7;
  } else {
    TORCH_CHECK(false, "emulated device preset '", name, "' is unknown; use h100, h200, a100 or orin, "
                "optionally followed by ,key=value overrides (e.g. 'orin,sm_count=2')");
  }
  return p;
}

void assign(DeviceProps& p, const std::string& key, int64_t v) {
  auto set_int = [&](int& dst, int64_t lo) {
    TORCH_CHECK(v >= lo && v <= INT32_MAX, "emulated device: ", key, "=", v, " is out of range");
    dst = int(v);
  };
  auto set_i64 = [&](int64_t& dst, int64_t lo) {
    TORCH_CHECK(v >= lo, "emulated device: ", key, "=", v, " is out of range");
    dst = v;
  };
  if (key == "sm_count") return set_int(p.sm_count, 1);
  if (key == "max_threads_per_sm") return set_int(p.max_threads_per_sm, 1);
  if (key == "max_threads_per_block") return set_int(p.max_threads_per_block, 1);
  if (key == "max_block_dim_x") return set_int(p.max_block_dim[0], 1);
  if (key == "max_block_dim_y") return set_int(p.max_block_dim[1], 1);
  if (key == "max_block_dim_z") return set_int(p.max_block_dim[2], 1);
  if (key == "max_grid_dim_x") return set_i64(p.max_grid_dim[0], 1);
  if (key == "max_grid_dim_y") return set_i64(p.max_grid_dim[1], 1);
  if (key == "max_grid_dim_z") return set_i64(p.max_grid_dim[2], 1);
  if (key == "shared_mem_per_block") return set_i64(p.shared_mem_per_block, 0);
  if (key == "shared_mem_per_block_optin") return set_i64(p.shared_mem_per_block_optin, 0);
  if (key == "cc_major") return set_int(p.cc_major, 1);
  if (key == "cc_minor") return set_int(p.cc_minor, 0);
  if (key == "registers_per_sm") return set_int(p.registers_per_sm, 1);
  if (key == "max_blocks_per_sm") return set_int(p.max_blocks_per_sm, 1);
  if (key == "shared_mem_per_sm") return set_i64(p.shared_mem_per_sm, 0);
  if (key == "reserved_shared_mem_per_block") return set_i64(p.reserved_shared_mem_per_block, 0);
  if (key == "registers_per_thread") return set_int(p.registers_per_thread, 1);
  if (key.rfind(kRegistersPrefix, 0) == 0 && key.size() > kRegistersPrefix.size()) {
    TORCH_CHECK(v >= 1 && v <= 255, "emulated device: ", key, "=", v, " is out of range (1..255 registers per thread)");
    const std::string kernel = key.substr(kRegistersPrefix.size());
    for (auto& entry : p.kernel_registers)
      if (entry.first == kernel) return void(entry.second = int(v));
    p.kernel_registers.emplace_back(kernel, int(v));
    return;
  }
  if (key == "warp_size") {
    TORCH_CHECK(v == 32, "emulated device: warp_size must be 32 (the shuffles implement 32-lane warps), got ", v);
    return;
  }
  std::ostringstream known;
  for (const auto& [name, value] : device_fields(p)) known << " " << name;
  TORCH_CHECK(false, "emulated device: unknown property '", key, "'; known:", known.str(), " ",
              kRegistersPrefix, "KERNEL_NAME_PREFIX");
}

DeviceProps initial_device() {
  const char* env = std::getenv("SYNCTRAIN_SIMT_DEVICE");
  return parse_device(env != nullptr && *env != '\0' ? env : "h100");
}

std::mutex& device_mutex() {
  static std::mutex m;
  return m;
}

DeviceProps& device_slot() {
  static DeviceProps props = initial_device();
  return props;
}

}  // namespace

DeviceProps parse_device(const std::string& spec) {
  // Items are separated by the commas outside <...>: a kernel's name in registers.NAME=N may hold template
  // arguments ("registers.stats_channels_last_kernel<c10::BFloat16, 8>=112").
  std::vector<std::string> parts;
  std::string item;
  int depth = 0;
  for (const char ch : spec + ",") {
    if (ch == ',' && depth == 0) {
      if (!item.empty()) parts.push_back(item);
      item.clear();
      continue;
    }
    depth += ch == '<' ? 1 : ch == '>' && depth > 0 ? -1 : 0;
    item += ch;
  }
  size_t i = 0;
  DeviceProps p;
  if (!parts.empty() && parts[0].find('=') == std::string::npos) p = preset(parts[i++]);
  for (; i < parts.size(); ++i) {
    const auto eq = parts[i].find('=');
    TORCH_CHECK(eq != std::string::npos, "emulated device '", spec, "': expected key=value, got '", parts[i], "'");
    const std::string key = parts[i].substr(0, eq), value = parts[i].substr(eq + 1);
    char* end = nullptr;
    const long long v = std::strtoll(value.c_str(), &end, 10);
    TORCH_CHECK(!value.empty() && end != nullptr && *end == '\0', "emulated device '", spec, "': ", key,
                " must be an integer, got '", value, "'");
    assign(p, key, v);
  }
  TORCH_CHECK(p.max_threads_per_block <= p.max_threads_per_sm, "emulated device: max_threads_per_block (",
              p.max_threads_per_block, ") exceeds max_threads_per_sm (", p.max_threads_per_sm, ")");
  if (i > 1 || (i == 1 && parts[0].find('=') != std::string::npos)) p.name = spec;
  return p;
}

DeviceProps current_device() {
  std::lock_guard<std::mutex> lock(device_mutex());
  return device_slot();
}

void set_device(const DeviceProps& props) {
  std::lock_guard<std::mutex> lock(device_mutex());
  device_slot() = props;
}

std::vector<std::pair<std::string, int64_t>> device_fields(const DeviceProps& p) {
  return {{"sm_count", p.sm_count},
          {"max_threads_per_sm", p.max_threads_per_sm},
          {"max_threads_per_block", p.max_threads_per_block},
          {"max_block_dim_x", p.max_block_dim[0]},
          {"max_block_dim_y", p.max_block_dim[1]},
          {"max_block_dim_z", p.max_block_dim[2]},
          {"max_grid_dim_x", p.max_grid_dim[0]},
          {"max_grid_dim_y", p.max_grid_dim[1]},
          {"max_grid_dim_z", p.max_grid_dim[2]},
          {"shared_mem_per_block", p.shared_mem_per_block},
          {"shared_mem_per_block_optin", p.shared_mem_per_block_optin},
          {"warp_size", p.warp_size},
          {"cc_major", p.cc_major},
          {"cc_minor", p.cc_minor},
          {"registers_per_sm", p.registers_per_sm},
          {"max_blocks_per_sm", p.max_blocks_per_sm},
          {"shared_mem_per_sm", p.shared_mem_per_sm},
          {"reserved_shared_mem_per_block", p.reserved_shared_mem_per_block},
          {"registers_per_thread", p.registers_per_thread}};
}

int kernel_registers(const DeviceProps& p, const std::string& kernel) {
  int registers = p.registers_per_thread;
  size_t longest = 0;
  for (const auto& [prefix, value] : p.kernel_registers) {
    if (prefix.size() > longest && kernel.rfind(prefix, 0) == 0) {
      longest = prefix.size();
      registers = value;
    }
  }
  return registers;
}

}  // namespace syncbn::simt
