"""DLPack for mydev tensors: `torch.from_dlpack` / `torch.utils.dlpack.from_dlpack` share their memory.

A mydev tensor travels as a DLPack `kDLExtDev` tensor (DLPack's device type for
"an extension device": PyTorch's C++ converter maps PrivateUse1 to it and back,
at::torchDeviceToDLDevice / at::fromDLPack), with the device index as device_id.
So a capsule made by `torch.utils.dlpack.to_dlpack` or `Tensor.__dlpack__` comes
back through `torch.from_dlpack` as a mydev tensor over the same bytes.

Why a patch is needed (torch 2.13): `torch.Tensor.__dlpack_device__`, which
`torch.from_dlpack` asks first, compares `self.device.type` with the literal
"privateuse1". Once the backend is renamed ("mydev") no tensor has that type,
so it raised `ValueError: Unknown device type mydev for Dlpack` although the C++
converter behind it handles PrivateUse1 (and `to_dlpack` works). The patch below
answers for the renamed backend's tensors and leaves every other device to
PyTorch's own method. `test/test_dlpack.py::test_torch_still_rejects_renamed_backend`
calls PyTorch's original method and fails once PyTorch handles renamed backends,
which is when this patch should go.

Stream ordering (`Tensor.__dlpack__(stream=...)`), as for CUDA tensors: the consumer passes the
stream it will use the memory on, and the producer makes that stream wait (with an event) for
the work queued so far on the tensor device's current stream. A mydev stream's handle is its
`stream_id` (`torch.mydev.current_stream().stream_id`; 0 is a device's default stream), on the
tensor's device. `stream=None` means the default stream; `stream=-1` (PyTorch's default) means
no synchronisation. PyTorch's own `__dlpack__` only synchronises CUDA tensors, hence the second
patch; `test_dlpack.py::test_torch_does_not_order_renamed_backend_streams` notices when that changes.

The imported tensor is a mydev tensor like any other (a MyDevTensorImpl): PyTorch's importer
(at::fromDLPack, through at::from_blob) builds a plain c10::TensorImpl whatever the device, without
dispatching anything the backend could implement, so `torch._C._from_dlpack` is wrapped to re-home the
result in a MyDevTensorImpl over the same storage (csrc/core/DLPack.cpp), whose DLPack deleter keeps the
producer alive. `test_dlpack.py::test_torch_still_imports_a_plain_tensor_impl` notices when PyTorch
makes the backend's own TensorImpl itself, and this patch can go.

A consumer that cannot address mydev memory gets the capsule's device and
refuses it (NumPy: "Unsupported device in DLTensor"), as it does for CUDA
tensors; `from_dlpack(t, device="cpu")` (or NumPy's `device="cpu"`) asks the
producer for a host copy instead.
"""
import enum

import torch

from . import _C, _patches

_BACKEND = "mydev"


def _mydev_dlpack_device(self):
    from torch.utils.dlpack import DLDeviceType

    index = self.device.index if self.device.index is not None else torch.mydev.current_device()
    return (DLDeviceType.kDLExtDev, index)


def _consumer_stream(stream, index: int):
    """The mydev stream on device `index` named by a DLPack `stream` argument (None: the default one)."""
    if stream is None:
        return torch.mydev.default_stream(index)
    if type(stream) is not int:
        # PyTorch's own check and message, which it applies to every device.
        raise TypeError("stream must be ``int`` or ``none``")
    try:
        _C._stream_priority(stream, index)   # validates the id and its device
    except RuntimeError as e:
        raise ValueError(f"unsupported stream on mydev:{index}: {stream} (a DLPack stream for a mydev tensor is "
                         f"the stream_id of a stream of the tensor's device, None or -1): {e}") from None
    producer = torch.mydev.current_stream(index)
    return torch.mydev.Stream(stream_id=stream, device_index=index, device_type=producer.device_type)


def _order_consumer_stream(tensor, stream) -> None:
    if stream == -1 and type(stream) is int:
        return
    index = tensor.device.index if tensor.device.index is not None else torch.mydev.current_device()
    consumer = _consumer_stream(stream, index)
    producer = torch.mydev.current_stream(index)
    if consumer != producer:
        consumer.wait_event(producer.record_event())


def install() -> None:
    _install_dlpack_device()
    _install_dlpack()
    _install_from_dlpack()


def _install_from_dlpack() -> None:
    # torch.from_dlpack and torch.utils.dlpack.from_dlpack look `torch._C._from_dlpack` up at each call.
    original = torch._C._from_dlpack

    def _from_dlpack(capsule):
        return _C._as_mydev_tensor(original(capsule))

    _from_dlpack.__doc__ = original.__doc__
    _patches.replace(torch._C, "_from_dlpack", _from_dlpack, target="torch._C._from_dlpack",
                     why="torch's importer builds a plain TensorImpl for any device: imports are re-homed in a MyDevTensorImpl",
                     test="test_dlpack.py::test_torch_still_imports_a_plain_tensor_impl")


def _install_dlpack() -> None:
    original = torch.Tensor.__dlpack__

    def __dlpack__(self, *, stream=-1, max_version=None, dl_device=None, copy=None):
        if self.device.type == _BACKEND and not torch.overrides.has_torch_function_unary(self):
            _order_consumer_stream(self, stream)
            stream = -1   # done: PyTorch's method (which synchronises CUDA only) need not see it
        return original(self, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    __dlpack__.__doc__ = original.__doc__
    _patches.replace(torch.Tensor, "__dlpack__", __dlpack__, target="torch.Tensor.__dlpack__",
                     why="torch orders the consumer's stream for CUDA tensors only",
                     test="test_dlpack.py::test_torch_does_not_order_renamed_backend_streams")


def _install_dlpack_device() -> None:
    original = torch.Tensor.__dlpack_device__

    def __dlpack_device__(self) -> "tuple[enum.IntEnum, int]":
        # Subclasses with __torch_function__ and every other device: PyTorch's own answer.
        if self.device.type == _BACKEND and not torch.overrides.has_torch_function_unary(self):
            return _mydev_dlpack_device(self)
        return original(self)

    __dlpack_device__.__doc__ = original.__doc__
    _patches.replace(torch.Tensor, "__dlpack_device__", __dlpack_device__, target="torch.Tensor.__dlpack_device__",
                     why="torch recognises the PrivateUse1 backend only by the name privateuse1",
                     test="test_dlpack.py::test_torch_still_rejects_renamed_backend")


def torch_original_dlpack_device():
    """PyTorch's own Tensor.__dlpack_device__ (for the test that notices when the patch is no longer needed)."""
    method = torch.Tensor.__dlpack_device__
    return getattr(method, "_torch_original", method)


def torch_original_dlpack():
    """PyTorch's own Tensor.__dlpack__ (for the test that notices when the patch is no longer needed)."""
    method = torch.Tensor.__dlpack__
    return getattr(method, "_torch_original", method)


def torch_original_from_dlpack():
    """PyTorch's own torch._C._from_dlpack (for the test that notices when the patch is no longer needed)."""
    fn = torch._C._from_dlpack
    return getattr(fn, "_torch_original", fn)
