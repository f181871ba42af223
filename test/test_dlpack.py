"""DLPack: mydev tensors leave and come back through DLPack sharing their memory, as CUDA tensors do."""
import numpy as np
import pytest
import torch
import torch.utils.dlpack

import my_device
from my_device import _dlpack
from conftest import delayed

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


def _import(t, how):
    """`t` through one of the four DLPack import paths."""
    if how == "from_dlpack":
        return torch.from_dlpack(t)
    if how == "utils_from_dlpack":
        return torch.utils.dlpack.from_dlpack(t)
    if how == "capsule":
        return torch.from_dlpack(torch.utils.dlpack.to_dlpack(t))
    return torch.from_dlpack(t.__dlpack__(max_version=(1, 0)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("how", ["from_dlpack", "utils_from_dlpack", "capsule", "versioned_capsule"])
def test_round_trip_shares_memory(dtype, how):
    cpu = (torch.arange(12).reshape(3, 4) % 5).to(dtype)
    t = cpu.to("mydev")
    u = _import(t, how)
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
    torch.mydev.synchronize()  # a queued arange would hold the block itself (KernelArgs.h)
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



# Stream ordering: `__dlpack__(stream=...)` as on CUDA. The producer's kernel is held back on its
# stream (the `delayed` test hook), so whether the consumer stream was made to wait for it shows in
# the consumer stream's query(), and in what a kernel queued on the consumer stream reads.

def test_torch_does_not_order_renamed_backend_streams():
    # The reason for the __dlpack__ patch: PyTorch's own method synchronises CUDA tensors only and
    # ignores `stream` for other devices. When this fails, PyTorch orders the consumer stream itself.
    x = torch.arange(1000.0, device="mydev")
    consumer = torch.mydev.Stream()
    torch.mydev.synchronize()
    with delayed(torch.mydev.current_stream()) as producer:
        y = x + 1
        _dlpack.torch_original_dlpack()(y, stream=consumer.stream_id)
        assert not producer.query() and consumer.query()


def test_consumer_stream_waits_for_queued_producer_work():
    x = torch.arange(1000.0, device="mydev")
    consumer = torch.mydev.Stream()
    torch.mydev.synchronize()
    with delayed(torch.mydev.current_stream()) as producer:
        y = x * 2 + 1                                    # queued, held back, on the producer stream
        capsule = y.__dlpack__(stream=consumer.stream_id)
        assert not producer.query()
        assert not consumer.query()                      # the consumer stream now waits for it
        with torch.mydev.stream(consumer):
            z = torch.from_dlpack(capsule) * 3           # queued on the consumer stream, after the wait
        consumer.synchronize()                           # only the consumer stream is waited for
        torch.testing.assert_close(z.cpu(), (torch.arange(1000.0) * 2 + 1) * 3)
        assert producer.query()


def test_consumer_stream_on_second_device_and_versioned_capsule():
    x = torch.arange(100.0, device="mydev:1")
    consumer = torch.mydev.Stream(device=1)
    torch.mydev.synchronize(1)
    with delayed(torch.mydev.current_stream(1)) as producer:
        y = x - 5
        capsule = y.__dlpack__(stream=consumer.stream_id, max_version=(1, 0))
        assert not producer.query() and not consumer.query()
        with torch.mydev.stream(consumer):
            z = torch.from_dlpack(capsule).neg()
        consumer.synchronize()
        torch.testing.assert_close(z.cpu(), 5 - torch.arange(100.0))


def test_stream_none_is_the_default_stream_and_minus_one_does_not_wait():
    x = torch.arange(100.0, device="mydev")
    side = torch.mydev.Stream()
    torch.mydev.synchronize()
    with torch.mydev.stream(side), delayed(side):        # producer: a side stream
        y = x + 1
        y.__dlpack__(stream=-1)
        assert not side.query() and torch.mydev.default_stream().query()   # -1: no wait added
        y.__dlpack__(stream=None)
        assert not torch.mydev.default_stream().query()                   # None: the default stream waits
        torch.mydev.default_stream().synchronize()
        assert side.query()
    # The producer's own current stream: nothing to order.
    y.__dlpack__(stream=torch.mydev.current_stream().stream_id)


def test_bad_stream_values_give_clear_errors_and_device_still_works():
    t = torch.arange(4.0, device="mydev:1")
    with pytest.raises(TypeError, match="stream must be ``int`` or ``none``"):
        t.__dlpack__(stream="1")
    with pytest.raises(TypeError, match="stream must be ``int`` or ``none``"):
        t.__dlpack__(stream=torch.mydev.Stream(device=1))
    with pytest.raises(ValueError, match=r"unsupported stream on mydev:1: 12345 .*Invalid mydev stream id 12345"):
        t.__dlpack__(stream=12345)
    on_device_0 = torch.mydev.Stream(device=0)
    with pytest.raises(ValueError, match=r"unsupported stream on mydev:1: .*belongs to mydev:0, not mydev:1"):
        t.__dlpack__(stream=on_device_0.stream_id)
    with pytest.raises(ValueError, match="unsupported stream on mydev:1: -2"):
        t.__dlpack__(stream=-2)
    # After the errors: the tensor exports and the device computes.
    u = torch.from_dlpack(t.__dlpack__(stream=torch.mydev.Stream(device=1).stream_id))
    torch.testing.assert_close((u * 2).cpu(), torch.arange(4.0) * 2)
    torch.mydev.synchronize(1)


# The imported tensor's TensorImpl: mydev's own, as for every other mydev tensor.

def test_torch_still_imports_a_plain_tensor_impl():
    # The reason for the torch._C._from_dlpack patch (my_device/_dlpack.py): PyTorch's importer builds a
    # plain c10::TensorImpl for every device. When this fails, PyTorch lets the backend make its own and
    # the patch can go.
    t = torch.arange(4.0, device="mydev")
    u = _dlpack.torch_original_from_dlpack()(torch.utils.dlpack.to_dlpack(t))
    assert my_device._C.impl_type_name(u) == "c10::TensorImpl"
    assert not my_device._C._is_mydev_tensor_impl(u)
    # The re-homing keeps the storage (so the capsule's deleter) and the geometry.
    v = my_device._C._as_mydev_tensor(u)
    assert my_device._C._is_mydev_tensor_impl(v)
    assert v.untyped_storage().data_ptr() == u.untyped_storage().data_ptr() and v.stride() == u.stride()
    # Tensors that need nothing are returned as they are.
    assert my_device._C._as_mydev_tensor(t) is t
    cpu = torch.arange(3.0)
    assert my_device._C._as_mydev_tensor(cpu) is cpu


@pytest.mark.parametrize("how", ["from_dlpack", "utils_from_dlpack", "capsule", "versioned_capsule"])
def test_imported_tensor_is_a_mydev_tensor_impl(how):
    base = torch.arange(24.0, device="mydev:1").reshape(4, 6)
    for t in (base, base[1:3, ::2], base.t()):
        u = _import(t, how)
        assert my_device._C.impl_type_name(u) == my_device._C.impl_type_name(t) == "my_device::MyDevTensorImpl"
        assert my_device._C._is_mydev_tensor_impl(u.detach())
        assert u.data_ptr() == t.data_ptr() and u.stride() == t.stride()


def test_ops_on_an_imported_tensor_match_cpu():
    cpu = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    t = cpu.to("mydev")
    u = torch.from_dlpack(t[2:, 1:])
    ref = cpu[2:, 1:]
    torch.testing.assert_close((u @ u.t() + u.sum(1)).cpu(), ref @ ref.t() + ref.sum(1))
    torch.testing.assert_close(u.reshape(-1).cpu(), ref.reshape(-1))
    u.mul_(2)
    torch.testing.assert_close(t[2:, 1:].cpu(), 2 * ref)   # one memory
    # `.data =` swaps TensorImpl contents (shallow_copy_from), which needs both to be mydev's own impl.
    p = torch.nn.Parameter(torch.zeros(6, 7, device="mydev"))
    p.data = u
    assert my_device._C._is_mydev_tensor_impl(p) and p.data_ptr() == u.data_ptr()
    torch.testing.assert_close(p.detach().cpu(), 2 * ref)
    # autograd through it (t now holds the doubled block)
    now = t.cpu()
    w = torch.from_dlpack(t).requires_grad_()
    (w.sin() * w).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), now.sin() + now * now.cos(), rtol=1e-5, atol=1e-5)


def test_producer_freed_while_queued_kernels_use_the_import():
    # 1 MB: over the size at which a kernel leases storages instead of holding them (KernelArgs.h).
    n = 256 * 1024
    t = torch.arange(n, dtype=torch.float32, device="mydev")
    allocated = torch.mydev.memory_allocated()
    u = torch.from_dlpack(t[1:])
    torch.mydev.synchronize()
    with delayed(torch.mydev.current_stream()):
        z = u * 2 + 1                    # queued, held back
        del t, u                          # the producer and the consumer's tensor, dropped by the host
        assert torch.mydev.memory_allocated() >= allocated   # the block is still the kernel's
    torch.testing.assert_close(z.cpu(), torch.arange(1, n, dtype=torch.float32) * 2 + 1)
    del z
    torch.mydev.synchronize()
    assert torch.mydev.memory_allocated() == allocated - 4 * n


def test_round_trips_keep_the_memory_and_the_impl():
    t = torch.arange(10.0, device="mydev")
    u = t
    for _ in range(3):
        u = torch.from_dlpack(torch.utils.dlpack.to_dlpack(u[1:]))
        assert my_device._C._is_mydev_tensor_impl(u)
    assert u.data_ptr() == t[3:].data_ptr()
    torch.testing.assert_close(u.cpu(), torch.arange(3.0, 10.0))
    # record_stream finds the producer's block from inside it (the import starts where the view did):
    # after `del`, the block waits for the side stream's queued work before it is reused.
    side = torch.mydev.Stream()
    u.record_stream(side)
    del t, u
    torch.mydev.synchronize()
