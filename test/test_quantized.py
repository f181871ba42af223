"""Quantized tensors on mydev (csrc/native/Quantized.cpp): per-tensor and per-channel affine
tensors made, viewed, computed on and moved as on the CPU, with the CPU's integers, quantizers and
errors."""
import io
import warnings

import pytest
import torch

import my_device  # noqa: F401
from conftest import delayed

# PyTorch deprecates quantized tensor creation; its warning says nothing about mydev.
pytestmark = pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*:UserWarning")


def assert_same_qtensor(dev, ref):
    assert dev.device.type == "mydev" and dev.is_quantized, dev
    assert dev.dtype == ref.dtype and dev.shape == ref.shape and dev.qscheme() == ref.qscheme()
    if ref.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        assert (dev.q_scale(), dev.q_zero_point()) == (ref.q_scale(), ref.q_zero_point())
    else:
        assert dev.q_per_channel_axis() == ref.q_per_channel_axis()
        assert dev.q_per_channel_scales().device.type == "mydev"
        torch.testing.assert_close(dev.q_per_channel_scales().cpu(), ref.q_per_channel_scales(), rtol=0, atol=0)
        torch.testing.assert_close(dev.q_per_channel_zero_points().cpu(), ref.q_per_channel_zero_points(),
                                   rtol=0, atol=0)
    torch.testing.assert_close(dev.int_repr().cpu(), ref.int_repr(), rtol=0, atol=0)
    torch.testing.assert_close(dev.dequantize().cpu(), ref.dequantize(), rtol=0, atol=0)


def per_tensor(x, dtype=torch.quint8):
    return torch.quantize_per_tensor(x, 0.05, 3 if dtype == torch.quint8 else 0, dtype)


def per_channel(x, axis=1, dtype=torch.qint8):
    n = x.shape[axis]
    scales = torch.linspace(0.02, 0.1, n, dtype=torch.float64, device=x.device)
    zero_points = torch.arange(n, device=x.device) % 3
    return torch.quantize_per_channel(x, scales, zero_points, axis, dtype)


def on_mydev(make, *tensors, **kwargs):
    return make(*(t.to("mydev") for t in tensors), **kwargs)


@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8, torch.qint32])
def test_quantize_per_tensor_like_cpu(dtype):
    x = torch.randn(3, 4, 5)
    assert_same_qtensor(on_mydev(per_tensor, x, dtype=dtype), per_tensor(x, dtype))
    # Scale and zero point as tensors, and a list of tensors.
    scale, zp = torch.tensor(0.1), torch.tensor(2 if dtype == torch.quint8 else 0)
    ref = torch.quantize_per_tensor(x, scale, zp, dtype)
    assert_same_qtensor(torch.quantize_per_tensor(x.to("mydev"), scale.to("mydev"), zp.to("mydev"), dtype), ref)
    refs = torch.quantize_per_tensor([x, x * 2], torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), dtype)
    outs = torch.quantize_per_tensor([x.to("mydev"), x.to("mydev") * 2], torch.tensor([0.1, 0.2], device="mydev"),
                                     torch.tensor([0, 1], device="mydev"), dtype)
    for out, ref in zip(outs, refs):
        assert_same_qtensor(out, ref)


def test_quantize_per_channel_and_dynamic_like_cpu():
    x = torch.randn(3, 4, 5)
    for axis in (0, 1, 2):
        assert_same_qtensor(on_mydev(per_channel, x, axis=axis), per_channel(x, axis))
    # Float zero points make the float-qparams quantizer.
    scales, zps = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.5, 1.0, 0.0])
    ref = torch.quantize_per_channel(x, scales, zps, 0, torch.quint8)
    out = torch.quantize_per_channel(x.to("mydev"), scales.to("mydev"), zps.to("mydev"), 0, torch.quint8)
    assert out.qscheme() == torch.per_channel_affine_float_qparams
    assert_same_qtensor(out, ref)
    assert_same_qtensor(torch.quantize_per_tensor_dynamic(x.to("mydev"), torch.quint8, False),
                        torch.quantize_per_tensor_dynamic(x, torch.quint8, False))
    ints = torch.randint(0, 255, (4, 6), dtype=torch.uint8)
    assert_same_qtensor(torch._make_per_tensor_quantized_tensor(ints.to("mydev"), 0.1, 4),
                        torch._make_per_tensor_quantized_tensor(ints, 0.1, 4))


def test_moves_between_cpu_and_mydev_keep_integers_and_quantizers():
    x = torch.randn(4, 6)
    for ref in (per_tensor(x), per_channel(x), per_channel(x, axis=0, dtype=torch.quint8)):
        dev = ref.to("mydev")
        assert_same_qtensor(dev, ref)
        back = dev.cpu()
        assert back.device.type == "cpu"
        if ref.qscheme() == torch.per_channel_affine:
            assert back.q_per_channel_scales().device.type == "cpu"
        del dev  # the CPU copy owns everything it holds
        torch.testing.assert_close(back.int_repr(), ref.int_repr(), rtol=0, atol=0)
        torch.testing.assert_close(back.dequantize(), ref.dequantize(), rtol=0, atol=0)


def test_factories_like_cpu():
    e = torch._empty_affine_quantized([2, 3], scale=0.5, zero_point=1, dtype=torch.qint8, device="mydev")
    assert (e.shape, e.dtype, e.q_scale(), e.q_zero_point()) == ((2, 3), torch.qint8, 0.5, 1)
    q = on_mydev(per_tensor, torch.randn(2, 3))
    like = torch.empty_like(q)
    assert like.device == q.device and (like.q_scale(), like.q_zero_point()) == (q.q_scale(), q.q_zero_point())
    pc = on_mydev(per_channel, torch.randn(2, 3))
    e = torch._empty_per_channel_affine_quantized([2, 3], scales=pc.q_per_channel_scales(),
                                                  zero_points=pc.q_per_channel_zero_points(), axis=1,
                                                  dtype=torch.qint8, device="mydev")
    assert e.q_per_channel_scales().device.type == "mydev"
    # torch.empty with a quantized dtype: a tensor with no quantizer yet, as on the CPU.
    target = torch.empty(2, 3, dtype=torch.quint8, device="mydev")
    assert (target.shape, target.dtype, target.is_quantized) == ((2, 3), torch.quint8, True)
    e = torch.empty_quantized([4], q, device="mydev")
    assert (e.shape, e.device, e.q_scale(), e.q_zero_point()) == ((4,), q.device, q.q_scale(), q.q_zero_point())
    # Sub-byte types take the CPU's byte count.
    for dtype in (torch.quint4x2, torch.quint2x4):
        ref = torch._empty_affine_quantized([3, 5], scale=1.0, zero_point=0, dtype=dtype)
        dev = torch._empty_affine_quantized([3, 5], scale=1.0, zero_point=0, dtype=dtype, device="mydev")
        assert dev.untyped_storage().nbytes() == ref.untyped_storage().nbytes()


def test_views_like_cpu():
    x = torch.randn(2, 3, 4)
    ref = per_tensor(x)
    dev = ref.to("mydev")
    for view in (lambda t: t.flatten(), lambda t: t.ravel(), lambda t: t.transpose(0, 2), lambda t: t[1, 1:],
                 lambda t: t.unsqueeze(1), lambda t: t.unsqueeze(0).squeeze(0), lambda t: t.view(6, 4),
                 lambda t: t.reshape(4, 6), lambda t: t.permute(2, 0, 1).contiguous(), lambda t: t.unfold(2, 2, 1),
                 lambda t: t.expand(3, 2, 3, 4), lambda t: t.select(2, 1), lambda t: t.detach()):
        out = view(dev)
        assert_same_qtensor(out, view(ref))
    assert dev.flatten().untyped_storage().data_ptr() == dev.untyped_storage().data_ptr()


def test_ops_like_cpu():
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    qx, qy = per_tensor(x), per_tensor(y)
    dx, dy = qx.to("mydev"), qy.to("mydev")
    assert_same_qtensor(torch.relu(dx), torch.relu(qx))
    assert_same_qtensor(torch.cat([dx, dy], 1), torch.cat([qx, qy], 1))
    assert_same_qtensor(dx.clone(), qx.clone())
    assert_same_qtensor(torch.nn.functional.gelu(dx), torch.nn.functional.gelu(qx))
    assert_same_qtensor(dx.flip(0), qx.flip(0))
    assert_same_qtensor(dx.index_select(1, torch.tensor([4, 0], device="mydev")),
                        qx.index_select(1, torch.tensor([4, 0])))
    assert_same_qtensor(torch.ops.quantized.add(dx, dy, 0.1, 2), torch.ops.quantized.add(qx, qy, 0.1, 2))
    assert_same_qtensor(torch.nn.functional.adaptive_avg_pool2d(dx.view(1, 1, 4, 6), 2),
                        torch.nn.functional.adaptive_avg_pool2d(qx.view(1, 1, 4, 6), 2))
    values, indices = torch.max(dx, 1)
    ref_values, ref_indices = torch.max(qx, 1)
    assert_same_qtensor(values, ref_values)
    torch.testing.assert_close(indices.cpu(), ref_indices)
    assert torch.equal(dx, dx.clone()) and not torch.equal(dx, dy)
    mask = x > 0
    filled, ref = dx.clone(), qx.clone()
    filled.masked_fill_(mask.to("mydev"), 0.5)
    ref.masked_fill_(mask, 0.5)
    assert_same_qtensor(filled, ref)
    filled.fill_(1.0)
    ref.fill_(1.0)
    assert_same_qtensor(filled, ref)


def test_runs_in_stream_order():
    # The quantizing kernel reads its input after the queued kernels that write it.
    x = torch.randn(64, 64)
    dev = x.to("mydev")
    with delayed(torch.mydev.current_stream()):
        dev.mul_(2)
        dev.add_(1)
        q = torch.quantize_per_tensor(dev, 0.05, 3, torch.quint8)
    assert_same_qtensor(q, per_tensor(x * 2 + 1))


def test_serialization_round_trip():
    for ref in (per_tensor(torch.randn(3, 4)), per_channel(torch.randn(3, 4))):
        buf = io.BytesIO()
        torch.save(ref.to("mydev"), buf)
        buf.seek(0)
        loaded = torch.load(buf)
        assert_same_qtensor(loaded, ref)


def test_fake_quantization_like_cpu():
    x = torch.randn(4, 5)
    ref = torch.fake_quantize_per_tensor_affine(x, 0.1, 3, 0, 255)
    torch.testing.assert_close(torch.fake_quantize_per_tensor_affine(x.to("mydev"), 0.1, 3, 0, 255).cpu(), ref)


def test_printing_shows_the_quantizer():
    text = repr(per_tensor(torch.tensor([0.5, -0.25])).to("mydev"))
    assert "device='mydev:0'" in text and "scale=0.05" in text and "zero_point=3" in text


def _device_still_works():
    x = torch.arange(6.0, device="mydev").reshape(2, 3)
    torch.testing.assert_close((x * 2 + 1).sum(0).cpu(), (torch.arange(6.0).reshape(2, 3) * 2 + 1).sum(0))


@pytest.mark.parametrize("call", [
    lambda d: torch.quantize_per_tensor(d.to(torch.int32), 0.1, 0, torch.quint8),  # not float
    lambda d: torch.empty(2, 3, device=d.device).copy_(per_tensor(d)),  # quantized into float
    lambda d: torch.empty_strided((2, 3), (3, 1), dtype=torch.quint8, device=d.device),
    lambda d: torch._empty_affine_quantized([2], scale=0.1, zero_point=0, dtype=torch.float32, device=d.device),
    lambda d: per_channel(d, axis=2),  # no such axis
    lambda d: torch.ops.quantized.add(per_tensor(d), per_tensor(d, torch.qint8), 0.1, 0),  # mixed dtypes
], ids=["int_input", "quantized_into_float", "empty_strided", "dense_dtype", "bad_axis", "mixed_dtypes"])
def test_bad_input_raises_like_cpu_and_loses_nothing(call):
    x = torch.randn(2, 3)
    kept = per_tensor(x).to("mydev")
    with pytest.raises(Exception) as cpu_error:
        call(x)
    with pytest.raises(type(cpu_error.value)) as error:
        call(x.to("mydev"))
    first_line = lambda e: str(e.value).split("(Triggered internally")[0].strip().splitlines()[0]
    assert first_line(error) == first_line(cpu_error)
    assert_same_qtensor(kept, per_tensor(x))
    _device_still_works()


def test_tensors_of_two_devices_are_refused():
    x = torch.randn(2, 3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.cat([per_tensor(x).to("mydev"), per_tensor(x)])
    _device_still_works()


def test_cpu_path_needs_no_warning_of_ours():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.quantize_per_tensor(torch.randn(3, device="mydev"), 0.1, 0, torch.qint8).int_repr().cpu()
    assert not [w for w in caught if "mydev" in str(w.message)]
