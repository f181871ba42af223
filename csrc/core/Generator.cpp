#include "Generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/util/irange.h>

#include <mutex>
#include <vector>

#include "Device.h"

namespace my_device {
namespace {

class GeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit GeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val)
      : c10::GeneratorImpl(c10::Device(kMyDev, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        engine_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

  void set_current_seed(uint64_t seed) override {
    engine_.set_current_seed(seed);
  }
  uint64_t current_seed() const override {
    return engine_.current_seed();
  }
  uint64_t seed() override {
    return engine_.seed();
  }
  void set_offset(uint64_t offset) override {
    engine_.set_offset(offset);
  }
  uint64_t get_offset() const override {
    return engine_.get_offset();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    engine_.unsafeGetGeneratorImpl()->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    return engine_.unsafeGetGeneratorImpl()->get_state();
  }
  static c10::DeviceType device_type() {
    return kMyDev;
  }

  const at::Generator& engine() const {
    return engine_;
  }

 private:
  GeneratorImpl* clone_impl() const override {
    auto* copy = new GeneratorImpl(device().index());
    copy->engine_ = engine_.clone();
    return copy;
  }

  at::Generator engine_;
};

} // namespace

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

at::Generator engine_of(const at::Generator& mydev_generator) {
  TORCH_CHECK(mydev_generator.device().type() == kMyDev, "expected a mydev generator, got one for ",
              mydev_generator.device());
  return static_cast<GeneratorImpl*>(mydev_generator.unsafeGetGeneratorImpl())->engine();
}

} // namespace my_device
