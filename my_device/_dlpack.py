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

A consumer that cannot address mydev memory gets the capsule's device and
refuses it (NumPy: "Unsupported device in DLTensor"), as it does for CUDA
tensors; `from_dlpack(t, device="cpu")` (or NumPy's `device="cpu"`) asks the
producer for a host copy instead.
"""
import enum

import torch

_BACKEND = "mydev"


def _mydev_dlpack_device(self):
    from torch.utils.dlpack import DLDeviceType

    index = self.device.index if self.device.index is not None else torch.mydev.current_device()
    return (DLDeviceType.kDLExtDev, index)


def install() -> None:
    original = torch.Tensor.__dlpack_device__
    if getattr(original, "_mydev_patch", False):
        return

    def __dlpack_device__(self) -> "tuple[enum.IntEnum, int]":
        # Subclasses with __torch_function__ and every other device: PyTorch's own answer.
        if self.device.type == _BACKEND and not torch.overrides.has_torch_function_unary(self):
            return _mydev_dlpack_device(self)
        return original(self)

    __dlpack_device__.__doc__ = original.__doc__
    __dlpack_device__._mydev_patch = True
    __dlpack_device__._torch_original = original
    torch.Tensor.__dlpack_device__ = __dlpack_device__


def torch_original_dlpack_device():
    """PyTorch's own Tensor.__dlpack_device__ (for the test that notices when the patch is no longer needed)."""
    method = torch.Tensor.__dlpack_device__
    return getattr(method, "_torch_original", method)
