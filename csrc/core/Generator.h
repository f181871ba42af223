#pragma once
#include <ATen/core/Generator.h>

namespace my_device {

// The default generator of a mydev device.
const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator make_generator(c10::DeviceIndex device);
// The CPU engine a mydev generator draws from. Random kernels run PyTorch's CPU
// random kernels on device memory and are handed this engine, so the same seed
// gives the same numbers as on CPU while the two generators stay independent.
at::Generator engine_of(const at::Generator& mydev_generator);

} // namespace my_device
