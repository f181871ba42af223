"""torch.accelerator.get_device_capability on mydev (GuardImpl::getDeviceCapability)."""
import pytest
import torch

import my_device  # noqa: F401

QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}


def _capability(device):
    # torch.accelerator caches its answer per argument; ask the binding directly too.
    return torch._C._accelerator_getDeviceCapability(device)


def test_reports_supported_dtypes():
    caps = torch.accelerator.get_device_capability("mydev:0")
    dtypes = caps["supported_dtypes"]
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex32, torch.complex64,
                  torch.complex128, torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                  torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2):
        assert dtype in dtypes, dtype
    assert not dtypes & QUANTIZED  # quantize_per_tensor raises on mydev
    assert _capability(0) == caps
    assert torch.accelerator.get_device_capability() == caps  # the current device


def test_every_reported_dtype_allocates_and_converts():
    for dtype in torch.accelerator.get_device_capability("mydev:0")["supported_dtypes"]:
        src = torch.tensor([0.0, 1.0, 0.5, 2.0]).to(dtype)
        dev = src.to("mydev")
        assert dev.dtype == dtype and dev.device.type == "mydev"
        torch.testing.assert_close(dev.cpu(), src, rtol=0, atol=0, msg=str(dtype))
        # Conversion to and from float32 on the device agrees with the CPU's.
        back = dev.to(torch.float32).to(dtype)
        ref = src.to(torch.float32).to(dtype)
        torch.testing.assert_close(back.cpu(), ref, rtol=0, atol=0, msg=str(dtype))
        assert torch.empty(3, dtype=dtype, device="mydev").shape == (3,)


def test_unsupported_dtypes_are_left_out_for_a_reason():
    # What is not reported cannot be converted to on mydev (or on any device).
    reported = torch.accelerator.get_device_capability("mydev:0")["supported_dtypes"]
    for dtype in QUANTIZED:
        assert dtype not in reported
    with pytest.raises(NotImplementedError, match="quantized tensors are not supported on mydev"):
        torch.quantize_per_tensor(torch.ones(2, device="mydev"), 0.1, 0, torch.qint8)


def test_bad_device_index():
    n = torch.mydev.device_count()
    with pytest.raises((RuntimeError, ValueError)):
        _capability(n + 3)
    assert torch.ones(2, device="mydev").sum().item() == 2
