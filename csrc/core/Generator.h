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
// The seed of the engine a random kernel at `offset` of a generator seeded
// with `seed` draws from.
uint64_t engine_seed(uint64_t seed, uint64_t offset);
// Takes `count` offsets of the generator's sequence at once: returns (its
// seed, the first offset) and advances the offset past them (a graph replay).
std::pair<uint64_t, uint64_t> reserve_offsets(const at::Generator& mydev_generator, uint64_t count);

} // namespace my_device
