// my_device._C._inductor: queues a kernel that Inductor's C++ code generation
// compiled for mydev on the current stream, as a Triton kernel is queued on a
// CUDA stream: the host returns at once, the kernel runs on the stream's worker
// after the work queued before it, and a failure is reported at the next
// synchronisation under the kernel's name.
//
// Every generated kernel gets one entry point of the same shape,
// `void entry(const int64_t* args)` (my_device/inductor/kernels.py writes it),
// so one launcher serves them all: pointers and integers travel as int64, a
// floating-point scalar as the bits of a double.
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "../core/Device.h"
#include "../core/KernelArgs.h"
#include "../core/Launch.h"

namespace my_device::inductor {
namespace {

using Entry = void (*)(const int64_t*);

// Launch labels must outlive their tasks; kernel names are few and long-lived.
const char* intern(const std::string& name) {
  static std::mutex mutex;
  static std::unordered_set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  return names.insert(name).first->c_str();
}

struct TensorSlot {
  size_t index;
  at::Tensor tensor;
};

// A call's arguments as the entry point takes them, its tensors' slots filled in when the kernel runs.
struct Packed {
  std::vector<int64_t> values;
  std::vector<TensorSlot> tensors;
  c10::DeviceIndex device = -1;

  // Each tensor's data, as the kernel reaches it.
  void fill_addresses() {
    for (const TensorSlot& slot : tensors) {
      const at::Tensor& t = slot.tensor;
      char* base = static_cast<char*>(t.storage().mutable_data());
      values[slot.index] =
          reinterpret_cast<int64_t>(kernel_address(base + t.storage_offset() * static_cast<int64_t>(t.itemsize())));
    }
  }
};

Packed pack(const std::string& name, const pybind11::args& call_args) {
  namespace py = pybind11;
  Packed packed;
  packed.values.assign(call_args.size(), 0);
  for (size_t i = 0; i < packed.values.size(); ++i) {
    py::handle arg = call_args[i];
    if (THPVariable_Check(arg.ptr())) {
      const at::Tensor& t = THPVariable_Unpack(arg.ptr());
      TORCH_CHECK(t.device().type() == kMyDev, "mydev kernel '", name, "': argument ", i, " is on ", t.device(),
                  ", expected a mydev tensor");
      if (packed.device < 0) {
        packed.device = t.device().index();
      } else {
        TORCH_CHECK(t.device().index() == packed.device, "mydev kernel '", name, "': argument ", i, " is on ",
                    t.device(), ", other arguments on mydev:", static_cast<int>(packed.device));
      }
      packed.tensors.push_back({i, t});
    } else if (py::isinstance<py::bool_>(arg) || py::isinstance<py::int_>(arg)) {
      packed.values[i] = arg.cast<int64_t>();
    } else if (py::isinstance<py::float_>(arg)) {
      const double d = arg.cast<double>();
      std::memcpy(&packed.values[i], &d, sizeof(d));
    } else {
      TORCH_CHECK(false, "mydev kernel '", name, "': argument ", i, " has unsupported type ",
                  std::string(py::str(arg.get_type())));
    }
  }
  if (packed.device < 0) packed.device = current_device();
  return packed;
}

// Called as launch(entry, name, *args): a kernel object is
// functools.partial(launch, entry, name), so a call costs no Python frame.
void launch(int64_t entry_address, const std::string& name, const pybind11::args& call_args) {
  const Entry entry = reinterpret_cast<Entry>(entry_address);
  const char* label = intern(name);
  Packed packed = pack(name, call_args);
  KernelArgs args(packed.device);
  for (TensorSlot& slot : packed.tensors) slot.tensor = args.own(slot.tensor);
  launch_async(packed.device, label, [entry, packed = std::move(packed)]() mutable {
    packed.fill_addresses();
    entry(packed.values.data());
  });
}

// For tests: the same call run now, on the calling thread, outside any launched function (the caller has
// synchronised the device). A kernel whose regions run as teams runs every team thread on this thread.
void run_here(int64_t entry_address, const std::string& name, const pybind11::args& call_args) {
  Packed packed = pack(name, call_args);
  packed.fill_addresses();
  reinterpret_cast<Entry>(entry_address)(packed.values.data());
}

} // namespace

void init_bindings(pybind11::module& parent) {
  namespace py = pybind11;
  auto m = parent.def_submodule("_inductor", "Launching Inductor-generated kernels on mydev streams.");
  m.def("launch", &launch,
        "launch(entry, name, *args): queues the compiled kernel at address `entry` on the current mydev "
        "stream with `args` (mydev tensors, ints, floats).");
  m.def("_test_run_here", &run_here,
        "_test_run_here(entry, name, *args): runs the kernel now on the calling thread, outside any launched "
        "function (tests).");
  // The generated wrapper's allocations: Inductor's generic path
  // (torch.empty_strided(..., device='mydev')) parses a device string per
  // buffer and drops the device index.
  m.def(
      "empty_strided",
      [](c10::IntArrayRef size, c10::IntArrayRef stride, py::object dtype, int64_t device) {
        const auto scalar_type = reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
        return at::empty_strided(size, stride,
                                 at::TensorOptions().dtype(scalar_type).device(kMyDev, static_cast<c10::DeviceIndex>(device)));
      },
      "empty_strided(size, stride, dtype, device_index): an uninitialised mydev buffer from the caching allocator.");
}

} // namespace my_device::inductor
