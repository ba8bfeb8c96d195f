// SyncBN kernel contract: the eight ops and their semantics are declared in csrc/ops.h (light,
// ATen-core only, included by the CPU and CUDA kernel files). This header adds what the Python
// bindings (csrc/bindings.cpp) need on top of it.
#pragma once
#include <torch/extension.h>

#include "ops.h"
