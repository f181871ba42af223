// my_device/_dlpack.py's calls into core/DLPack.cpp.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "../core/DLPack.h"

namespace my_device {

void init_dlpack_bindings(pybind11::module& m) {
  m.def("_as_mydev_tensor", &as_mydev_tensor,
        "A mydev tensor whose TensorImpl is not mydev's (from at::from_blob: DLPack) re-homed in a "
        "MyDevTensorImpl over the same storage; any other tensor as it is.");
  m.def("_is_mydev_tensor_impl", &is_mydev_tensor_impl, "Whether the tensor's TensorImpl is MyDevTensorImpl.");
}

} // namespace my_device
