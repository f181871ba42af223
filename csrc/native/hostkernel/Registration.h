#pragma once
// The generic host-kernel registration (see Registration.cpp) and what it did.
#include <string>
#include <utility>
#include <vector>

namespace my_device {

// Registers host_kernel for PrivateUse1 on every aten overload with a CPU kernel
// that has no PrivateUse1 kernel yet and is not excluded, and likewise for the
// sparse keys (SparseCPU -> SparsePrivateUse1, SparseCsrCPU -> SparseCsrPrivateUse1)
// and the quantized one (QuantizedCPU -> QuantizedPrivateUse1). Call once, after every
// static registration of this library has run (Module.cpp's init does).
void register_all_host_kernels();

struct HostKernelCoverage {
  std::vector<std::string> host_kernel;  // registered by register_all_host_kernels
  std::vector<std::string> sparse_host_kernel;  // for SparsePrivateUse1 / SparseCsrPrivateUse1
  std::vector<std::string> quantized_host_kernel;  // for QuantizedPrivateUse1 (aten and quantized:: ops)
  std::vector<std::string> own_kernel;   // already had a mydev kernel of their own
  std::vector<std::pair<std::string, std::string>> excluded;  // with the reason
};
const HostKernelCoverage& host_kernel_coverage();

} // namespace my_device
