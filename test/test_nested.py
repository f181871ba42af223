"""Nested tensors on mydev: what works equals the CPU, what does not raises a clear
NotImplementedError naming the op (csrc/native/NestedTensor.cpp), and the device keeps working
after it."""
import pytest
import torch

import my_device  # noqa: F401


def _device_still_works():
    x = torch.arange(6.0, device="mydev").reshape(2, 3)
    torch.testing.assert_close((x * 2 + 1).sum(0).cpu(), (torch.arange(6.0).reshape(2, 3) * 2 + 1).sum(0))


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


def test_strided_nested_tensor_that_requires_grad_is_built_and_raises_clearly():
    # Autograd asks for the nested sizes as the tensor is built; that query used to end the process.
    nt = torch.nested.as_nested_tensor([torch.randn(2, 3, device="mydev", requires_grad=True)])
    assert nt.requires_grad and nt.is_nested
    with pytest.raises(NotImplementedError, match="no kernel for strided nested tensors on mydev"):
        torch.nested.to_padded_tensor(nt, 0.0)
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


def _jagged(items, device, requires_grad=False):
    """A jagged [batch, heads, j, dim] nested tensor (as attention takes it) and its leaf."""
    leaf = torch.nested.nested_tensor([t.to(device) for t in items], layout=torch.jagged,
                                      requires_grad=requires_grad)
    return leaf.transpose(1, 2), leaf


def _sequences(lengths, heads, dim, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, heads, dim, generator=g) for n in lengths]


@pytest.mark.parametrize("case", ["self", "cross", "scale", "value_dim", "float64"])
def test_jagged_attention_like_cpu(case):
    # my_device/_nested_sdpa.py: PyTorch's math path goes through strided nested tensors.
    dtype = torch.float64 if case == "float64" else torch.float32
    q_items = _sequences((5, 3, 7), 2, 8, 0)
    kv_lengths = (4, 6, 2) if case == "cross" else (5, 3, 7)
    k_items = q_items if case == "self" else _sequences(kv_lengths, 2, 8, 1)
    v_items = q_items if case == "self" else _sequences(kv_lengths, 2, 6 if case == "value_dim" else 8, 2)
    kwargs = {"scale": 0.3} if case == "scale" else {}

    def attend(device):
        leaves, inputs = [], []
        for items in (q_items, k_items, v_items):
            nt, leaf = _jagged([t.to(dtype) for t in items], device, requires_grad=True)
            leaves.append(leaf)
            inputs.append(nt)
        out = torch.nn.functional.scaled_dot_product_attention(*inputs, **kwargs)
        # A loss that weighs each output element differently, so the gradients check every one.
        weights = torch.linspace(-1, 1, out.values().numel(), dtype=dtype, device=device).view_as(out.values())
        (out.values() * weights).sum().backward()
        return out, [leaf.grad for leaf in leaves]

    out, grads = attend("mydev")
    ref, ref_grads = attend("cpu")
    assert out.is_nested and out.layout == torch.jagged and out.device.type == "mydev"
    assert out.shape[:2] == ref.shape[:2] and out.shape[3] == ref.shape[3] and out._ragged_idx == ref._ragged_idx
    assert out.offsets().cpu().tolist() == ref.offsets().tolist()
    torch.testing.assert_close(out.values().cpu(), ref.values())
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.values().cpu(), r.values())


def test_jagged_attention_output_keeps_the_query_ragged_size():
    # As PyTorch's path: the output shares the query's offsets, so a residual connection works.
    nt, _ = _jagged(_sequences((5, 3), 2, 8, 0), "mydev")
    out = torch.nn.functional.scaled_dot_product_attention(nt, nt, nt)
    assert out.shape == nt.shape
    residual = out + nt
    cpu_nt, _ = _jagged(_sequences((5, 3), 2, 8, 0), "cpu")
    cpu_out = torch.nn.functional.scaled_dot_product_attention(cpu_nt, cpu_nt, cpu_nt)
    torch.testing.assert_close(residual.values().cpu(), (cpu_out + cpu_nt).values())


@pytest.mark.parametrize("kwargs", [{"attn_mask": "mask"}, {"is_causal": True}], ids=["mask", "causal"])
def test_jagged_attention_rejects_what_cpu_rejects(kwargs):
    def error(device):
        nt, _ = _jagged(_sequences((5, 3), 2, 8, 0), device)
        args = dict(kwargs)
        if args.get("attn_mask") == "mask":
            args["attn_mask"] = torch.ones(3, 3, dtype=torch.bool, device=device)
        with pytest.raises(Exception) as info:
            torch.nn.functional.scaled_dot_product_attention(nt, nt, nt, **args)
        return type(info.value), str(info.value)

    assert error("mydev") == error("cpu")
    _device_still_works()


def test_torch_jagged_attention_still_needs_strided_nested_kernels():
    # The reason for my_device/_nested_sdpa.py: PyTorch's own jagged SDPA converts to strided nested
    # tensors, which have no kernels on mydev. When this fails, remove the module.
    from my_device import _nested_sdpa

    nt, _ = _jagged(_sequences((5, 3), 2, 8, 0), "mydev")
    with pytest.raises(NotImplementedError, match="has no kernel for strided nested tensors on mydev"):
        _nested_sdpa.torch_jagged_scaled_dot_product_attention()(nt, nt, nt)
    _device_still_works()
