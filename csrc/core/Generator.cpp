#include "Generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/GeneratorImpl.h>

#include <cstring>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/util/irange.h>

#include <mutex>
#include <vector>

#include "Device.h"
#include "Graph.h"
#include "Stream.h"

namespace my_device {
namespace {

// A counter-based generator, like CUDA's Philox: its state is (seed, offset).
// Each random kernel gets a CPU engine seeded from a hash of (seed, offset)
// and advances the offset by one, so any point of the sequence can be
// restored with set_offset, and nothing is shared with the CPU generator.
class GeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit GeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val)
      : c10::GeneratorImpl(c10::Device(kMyDev, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        seed_(seed) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override {
    return seed_;
  }
  uint64_t seed() override {
    const uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  void set_offset(uint64_t offset) override {
    offset_ = offset;
  }
  uint64_t get_offset() const override {
    return offset_;
  }
  // The state is 16 bytes: seed then offset, both little-endian uint64.
  void set_state(const c10::TensorImpl& new_state) override {
    TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && new_state.numel() == 16 &&
                    new_state.device().is_cpu(),
                "mydev generator state must be a CPU ByteTensor of 16 bytes, got ", new_state.numel(),
                " elements of ", new_state.dtype(), " on ", new_state.device());
    const auto* bytes = static_cast<const uint8_t*>(new_state.data());
    std::memcpy(&seed_, bytes, 8);
    std::memcpy(&offset_, bytes + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::detail::empty_cpu({16}, at::kByte, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
    auto* bytes = static_cast<uint8_t*>(state.data_ptr());
    std::memcpy(bytes, &seed_, 8);
    std::memcpy(bytes + 8, &offset_, 8);
    return state.getIntrusivePtr();
  }
  static c10::DeviceType device_type() {
    return kMyDev;
  }

  at::Generator next_engine() {
    return at::make_generator<at::CPUGeneratorImpl>(engine_seed(seed_, offset_++));
  }
  std::pair<uint64_t, uint64_t> reserve(uint64_t count) {
    const uint64_t first = offset_;
    offset_ += count;
    return {seed_, first};
  }

 private:
  GeneratorImpl* clone_impl() const override {
    auto* copy = new GeneratorImpl(device().index(), seed_);
    copy->offset_ = offset_;
    return copy;
  }

  uint64_t seed_;
  uint64_t offset_ = 0;
};

} // namespace

uint64_t engine_seed(uint64_t seed, uint64_t offset) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (offset + 1);  // splitmix64 of (seed, offset)
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::once_flag once;
  static std::vector<at::Generator> generators;
  std::call_once(once, [] {
    for (auto i : c10::irange(device_count())) {
      generators.push_back(at::make_generator<GeneratorImpl>(static_cast<c10::DeviceIndex>(i)));
    }
  });
  if (device < 0) device = current_device();
  check_device_index(device);
  return generators[device];
}

at::Generator make_generator(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device_index(device);
  return at::make_generator<GeneratorImpl>(device);
}

at::Generator next_engine(const at::Generator& mydev_generator) {
  TORCH_CHECK(mydev_generator.device().type() == kMyDev, "expected a mydev generator, got one for ",
              mydev_generator.device());
  if (C10_UNLIKELY(capture_underway())) {
    // Captured: the engine's seed is set at each replay (Graph.h).
    unsigned long long capture = 0;
    if (stream_capturing(current_stream_handle(mydev_generator.device().index()), &capture)) {
      return capture_engine(capture, mydev_generator);
    }
  }
  std::lock_guard<std::mutex> lock(mydev_generator.unsafeGetGeneratorImpl()->mutex_);
  return static_cast<GeneratorImpl*>(mydev_generator.unsafeGetGeneratorImpl())->next_engine();
}

std::pair<uint64_t, uint64_t> reserve_offsets(const at::Generator& mydev_generator, uint64_t count) {
  std::lock_guard<std::mutex> lock(mydev_generator.unsafeGetGeneratorImpl()->mutex_);
  return static_cast<GeneratorImpl*>(mydev_generator.unsafeGetGeneratorImpl())->reserve(count);
}

} // namespace my_device
