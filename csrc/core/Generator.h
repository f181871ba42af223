#pragma once
#include <ATen/core/Generator.h>

namespace my_device {

// The default generator of a mydev device.
const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator make_generator(c10::DeviceIndex device);
// A CPU generator for one random kernel, derived from the mydev generator's
// (seed, offset), whose offset it advances. Random kernels run PyTorch's CPU
// random kernels on device memory with it, so results are reproducible per
// seed and offset and independent of the CPU generator.
at::Generator next_engine(const at::Generator& mydev_generator);

} // namespace my_device
