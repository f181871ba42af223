"""DLPack: mydev tensors leave and come back through DLPack sharing their memory, as CUDA tensors do."""
import numpy as np
import pytest
import torch
import torch.utils.dlpack

import my_device
from my_device import _dlpack

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, torch.complex64]


def _same_memory(a, b):
    return a.data_ptr() == b.data_ptr() and a.device == b.device


def test_torch_still_rejects_renamed_backend():
    # The reason for my_device/_dlpack.py: PyTorch's own __dlpack_device__ knows
    # the PrivateUse1 backend only by the name "privateuse1". When this test
    # fails, PyTorch handles renamed backends and the patch can go.
    t = torch.ones(2, device="mydev")
    with pytest.raises(ValueError, match="Unknown device type mydev for Dlpack"):
        _dlpack.torch_original_dlpack_device()(t)


def test_dlpack_device():
    assert torch.ones(2, device="mydev").__dlpack_device__() == (torch.utils.dlpack.DLDeviceType.kDLExtDev, 0)
    assert torch.ones(2, device="mydev:1").__dlpack_device__() == (torch.utils.dlpack.DLDeviceType.kDLExtDev, 1)
    # Other devices keep PyTorch's answer.
    assert torch.ones(2).__dlpack_device__() == (torch.utils.dlpack.DLDeviceType.kDLCPU, 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("how", ["from_dlpack", "utils_from_dlpack", "capsule", "versioned_capsule"])
def test_round_trip_shares_memory(dtype, how):
    cpu = (torch.arange(12).reshape(3, 4) % 5).to(dtype)
    t = cpu.to("mydev")
    if how == "from_dlpack":
        u = torch.from_dlpack(t)
    elif how == "utils_from_dlpack":
        u = torch.utils.dlpack.from_dlpack(t)
    elif how == "capsule":
        u = torch.from_dlpack(torch.utils.dlpack.to_dlpack(t))
    else:
        u = torch.from_dlpack(t.__dlpack__(max_version=(1, 0)))
    assert u.device == t.device and u.dtype == dtype and u.shape == t.shape and u.stride() == t.stride()
    assert _same_memory(u, t)
    torch.testing.assert_close(u.cpu(), cpu)
    # Writes through either tensor are seen by the other: one memory.
    one = torch.ones((), dtype=dtype)
    u[1, 2] = one.to("mydev")
    assert t[1, 2].cpu() == one
    t[0].zero_()
    assert (u[0].cpu() == 0).all()


def test_views_and_devices_keep_geometry():
    base = torch.arange(40.0, device="mydev:1").reshape(5, 8)
    for view in (base[1:4, ::2], base.t(), base[2], base[:, 3:4]):
        u = torch.from_dlpack(view)
        assert u.device == torch.device("mydev:1")
        assert u.data_ptr() == view.data_ptr() and u.shape == view.shape
        torch.testing.assert_close(u.cpu(), view.cpu())
    # A dlpack'd tensor is an ordinary mydev tensor: kernels, autograd, queued ops.
    u = torch.from_dlpack(base).requires_grad_()
    (u * u).sum().backward()
    torch.testing.assert_close(u.grad.cpu(), 2 * base.cpu())


def test_memory_outlives_producer():
    t = torch.arange(6.0, device="mydev")
    ptr = t.data_ptr()
    u = torch.from_dlpack(t)
    allocated = torch.mydev.memory_allocated()
    del t
    assert torch.mydev.memory_allocated() == allocated  # the consumer holds the block
    assert u.data_ptr() == ptr
    torch.testing.assert_close(u.cpu(), torch.arange(6.0))
    del u
    assert torch.mydev.memory_allocated() == allocated - 512


def test_copy_and_device_arguments():
    t = torch.arange(4.0, device="mydev")
    c = torch.from_dlpack(t, copy=True)
    assert c.device == t.device and c.data_ptr() != t.data_ptr()
    torch.testing.assert_close(c.cpu(), t.cpu())
    # A host copy on request, as for CUDA tensors.
    h = torch.from_dlpack(t, device="cpu")
    assert h.device.type == "cpu"
    torch.testing.assert_close(h, t.cpu())
    with pytest.raises(ValueError, match="without copying"):
        torch.from_dlpack(t, device="cpu", copy=False)
    # To another device: a copy, as between CUDA devices.
    other = torch.from_dlpack(t, device="mydev:1")
    assert other.device == torch.device("mydev:1")
    torch.testing.assert_close(other.cpu(), t.cpu())
    with pytest.raises(ValueError, match="without copying"):
        torch.from_dlpack(t, device="mydev:1", copy=False)
    # And the other way: a CPU tensor to mydev through DLPack.
    m = torch.from_dlpack(torch.arange(3.0), device="mydev")
    assert m.device.type == "mydev"
    torch.testing.assert_close(m.cpu(), torch.arange(3.0))


def test_consumer_without_the_device_gets_a_clear_error_and_device_still_works():
    t = torch.arange(4.0, device="mydev")
    # NumPy reads host memory only: it refuses the extension device's tensor,
    # as it refuses a CUDA tensor.
    with pytest.raises((RuntimeError, BufferError), match="[Uu]nsupported device"):
        np.from_dlpack(t)
    # Asked for the host, the producer copies (the DLPack dl_device protocol).
    if "device" in np.from_dlpack.__doc__:
        np.testing.assert_array_equal(np.from_dlpack(t, device="cpu"), np.arange(4.0))
    # A tensor DLPack cannot describe: PyTorch's own errors, as for CUDA.
    with pytest.raises(BufferError, match="require gradient"):
        torch.from_dlpack(t.clone().requires_grad_())
    with pytest.raises(BufferError, match="conjugate bit"):
        torch.from_dlpack(t.to(torch.complex64).conj())
    # The device and its tensors are unaffected.
    torch.testing.assert_close((t * 2).cpu(), torch.arange(4.0) * 2)
    torch.mydev.synchronize()

