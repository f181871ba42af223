"""Nested and quantized tensors on mydev: what works equals the CPU, what does not raises a clear
NotImplementedError naming the op (csrc/native/NestedTensor.cpp, csrc/native/Quantized.cpp), and
the device keeps working after it."""
import pytest
import torch

import my_device  # noqa: F401


def _device_still_works():
    x = torch.arange(6.0, device="mydev").reshape(2, 3)
    torch.testing.assert_close((x * 2 + 1).sum(0).cpu(), (torch.arange(6.0).reshape(2, 3) * 2 + 1).sum(0))


@pytest.mark.parametrize("call", [
    lambda x: torch.quantize_per_tensor(x, 0.1, 3, torch.quint8),
    lambda x: torch.quantize_per_tensor(x, torch.tensor(0.1, device="mydev"), torch.tensor(3, device="mydev"),
                                        torch.qint8),
    lambda x: torch.quantize_per_tensor([x, x], torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), torch.qint8),
    lambda x: torch.quantize_per_tensor_dynamic(x, torch.quint8, False),
    lambda x: torch.quantize_per_channel(x, torch.tensor([0.1, 0.2], device="mydev"),
                                         torch.tensor([0, 0], device="mydev"), 0, torch.qint8),
    lambda x: torch._empty_affine_quantized([2], scale=0.1, zero_point=0, dtype=torch.quint8, device="mydev"),
    lambda x: torch._make_per_tensor_quantized_tensor(x.to(torch.uint8), 0.1, 0),
], ids=["per_tensor", "per_tensor_tensor_qparams", "per_tensor_list", "dynamic", "per_channel", "empty",
        "make_per_tensor"])
def test_quantizing_on_mydev_raises_clearly(call):
    x = torch.randn(2, 3, device="mydev")
    with pytest.raises(NotImplementedError, match=r"quantized tensors are not supported on mydev: aten::"):
        call(x)
    _device_still_works()
    # The CPU path the message points to works, and so does moving its dequantized result.
    q = torch.quantize_per_tensor(x.cpu(), 0.1, 3, torch.quint8)
    torch.testing.assert_close(q.dequantize().to("mydev").cpu(), q.dequantize())


def test_fake_quantization_runs_on_mydev_like_cpu():
    x = torch.randn(4, 5)
    ref = torch.fake_quantize_per_tensor_affine(x, 0.1, 3, 0, 255)
    out = torch.fake_quantize_per_tensor_affine(x.to("mydev"), 0.1, 3, 0, 255)
    torch.testing.assert_close(out.cpu(), ref)


def _strided_nested():
    return torch.nested.nested_tensor([torch.randn(2, 4, device="mydev"), torch.randn(3, 4, device="mydev")])


@pytest.mark.parametrize("call,op", [
    (lambda nt: nt * 2, "aten::mul.Tensor"),
    (lambda nt: torch.relu(nt), "aten::relu"),
    (lambda nt: nt.unbind()[0], "aten::unbind.int"),
    (lambda nt: torch.nested.to_padded_tensor(nt, 0.0), "aten::to_padded_tensor"),
], ids=["mul", "relu", "unbind", "to_padded_tensor"])
def test_strided_nested_op_without_kernel_raises_clearly(call, op):
    nt = _strided_nested()
    assert nt.is_nested and nt.device.type == "mydev"
    with pytest.raises(NotImplementedError, match=f"{op} has no kernel for strided nested tensors on mydev"):
        call(nt)
    _device_still_works()


JAGGED_OPS = {
    "mul": lambda nt: nt * 2,
    "add": lambda nt: nt + nt,
    "relu": torch.relu,
    "sum": lambda nt: nt.sum(-1),
    "softmax": lambda nt: nt.softmax(-1),
    "linear": lambda nt: torch.nn.functional.linear(nt, torch.arange(20.0, device=nt.device).reshape(5, 4) / 20),
    "to_padded": lambda nt: nt.to_padded_tensor(0.0),
    "unbind": lambda nt: nt.unbind()[1],
}


@pytest.mark.parametrize("name", JAGGED_OPS)
def test_jagged_nested_ops_like_cpu(name):
    g = torch.Generator().manual_seed(0)
    items = [torch.randn(2, 4, generator=g), torch.randn(3, 4, generator=g)]

    def run(device):
        nt = torch.nested.nested_tensor([t.to(device) for t in items], layout=torch.jagged)
        out = JAGGED_OPS[name](nt)
        return out.values() if out.is_nested else out

    out = run("mydev")
    assert out.device.type == "mydev"
    torch.testing.assert_close(out.cpu(), run("cpu"))


def test_jagged_attention_is_a_known_gap():
    # PyTorch's math path for jagged scaled_dot_product_attention converts to strided nested
    # tensors (README: not supported on mydev). When this starts to pass on mydev, update the README.
    g = torch.Generator().manual_seed(0)
    items = [torch.randn(s, 2, 8, generator=g) for s in (5, 3)]

    def attend(device):
        nt = torch.nested.nested_tensor([t.to(device) for t in items], layout=torch.jagged).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(nt, nt, nt)

    assert attend("cpu").is_nested
    with pytest.raises(RuntimeError):
        attend("mydev")
    _device_still_works()
