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
    assert QUANTIZED <= dtypes
    assert _capability(0) == caps
    assert torch.accelerator.get_device_capability() == caps  # the current device


def test_every_reported_dtype_allocates_and_converts():
    for dtype in torch.accelerator.get_device_capability("mydev:0")["supported_dtypes"] - QUANTIZED:
        src = torch.tensor([0.0, 1.0, 0.5, 2.0]).to(dtype)
        dev = src.to("mydev")
        assert dev.dtype == dtype and dev.device.type == "mydev"
        torch.testing.assert_close(dev.cpu(), src, rtol=0, atol=0, msg=str(dtype))
        # Conversion to and from float32 on the device agrees with the CPU's.
        back = dev.to(torch.float32).to(dtype)
        ref = src.to(torch.float32).to(dtype)
        torch.testing.assert_close(back.cpu(), ref, rtol=0, atol=0, msg=str(dtype))
        assert torch.empty(3, dtype=dtype, device="mydev").shape == (3,)


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*:UserWarning")
def test_quantized_dtypes_quantize_and_move():
    # Quantized dtypes are reached by quantizing, not by .to(dtype), on every device.
    src = torch.tensor([0.0, 1.0, 0.5, 2.0])
    for dtype in QUANTIZED:
        ref = torch.quantize_per_tensor(src, 0.5, 0, dtype)
        dev = torch.quantize_per_tensor(src.to("mydev"), 0.5, 0, dtype)
        assert dev.dtype == dtype and dev.device.type == "mydev"
        torch.testing.assert_close(dev.dequantize().cpu(), ref.dequantize(), rtol=0, atol=0, msg=str(dtype))
        if dtype not in (torch.quint4x2, torch.quint2x4):  # the CPU's copy_ has no kernel for these
            torch.testing.assert_close(ref.to("mydev").dequantize().cpu(), ref.dequantize(), rtol=0, atol=0)


def test_bad_device_index():
    n = torch.mydev.device_count()
    with pytest.raises((RuntimeError, ValueError)):
        _capability(n + 3)
    assert torch.ones(2, device="mydev").sum().item() == 2
