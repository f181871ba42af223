"""Layer norm's own kernels (csrc/native/Normalization.cpp): at the call on an idle
stream, queued behind other work, and in strict mode, forward and backward equal
the CPU's to the bit, with the CPU's output geometry and the CPU's errors at the
call."""
import pytest
import torch
import torch.nn.functional as F

import my_device  # noqa: F401

from conftest import delayed, host_kernel_calls

pytestmark = pytest.mark.usefixtures("kernel_threads")  # (the tests compare bits with the CPU's)

CASES = [
    ((1, 1, 128), (128,)),      # a decoding step's hidden state
    ((4, 8, 16), (8, 16)),      # two normalized dimensions
    ((64, 768), (768,)),        # past the short-kernel size: queued
    ((3, 5), (5,)),
]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _forward_and_grads(device, x, w, b, ns, grad):
    x, w, b = (t.detach().to(device).requires_grad_() if t is not None else None for t in (x, w, b))
    out = torch.native_layer_norm(x, ns, w, b, 1e-5)
    grads = torch.autograd.grad(out[0], [t for t in (x, w, b) if t is not None], grad.to(device))
    return [t.detach().cpu() for t in out], [g.cpu() for g in grads]


def _assert_same(got, want):
    for g, w in zip(got, want):
        assert (g.shape, g.stride(), g.dtype) == (w.shape, w.stride(), w.dtype)
        assert torch.equal(g, w)


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,ns", CASES)
def test_forward_and_backward_equal_the_cpu(shape, ns, dtype, busy):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(dtype)
    w = torch.randn(ns, generator=g).to(dtype)
    b = torch.randn(ns, generator=g).to(dtype)
    grad = torch.randn(shape, generator=g).to(dtype)
    want = _forward_and_grads("cpu", x, w, b, ns, grad)
    torch.mydev.synchronize()
    if busy:
        with delayed(torch.mydev.default_stream(), us=20_000):
            got = _forward_and_grads("mydev", x, w, b, ns, grad)
    else:
        got = _forward_and_grads("mydev", x, w, b, ns, grad)
    _assert_same(got[0], want[0])
    _assert_same(got[1], want[1])


@pytest.mark.parametrize("needs_grad", ["weight", "bias", "input", "weight,bias"])
@pytest.mark.parametrize("shape", [(64, 16), (3, 16)], ids=["queued", "short"])
def test_backward_computes_only_the_gradients_asked_for(needs_grad, shape):
    # A layer norm over data that needs no gradient (a model's first layer) asks native_layer_norm_backward
    # for the parameters' gradients only: its grad_input output is then undefined.
    g = torch.Generator().manual_seed(0)
    x, w, b, dy = (torch.randn(s, generator=g) for s in (shape, (16,), (16,), shape))
    grads = []
    for device in ("cpu", "mydev", "mydev"):  # (a signature's first call runs at the call; the second not)
        named = {name: t.to(device).requires_grad_(name in needs_grad)
                 for name, t in zip(("input", "weight", "bias"), (x, w, b))}
        out = F.layer_norm(named["input"], (16,), named["weight"], named["bias"])
        wanted = [t for name, t in named.items() if name in needs_grad]
        grads.append([t.cpu() for t in torch.autograd.grad(out, wanted, dy.to(device))])
    _assert_same(grads[1], grads[0])
    _assert_same(grads[2], grads[0])


@pytest.mark.parametrize("weights", ["none", "weight", "bias"])
def test_strided_mixed_dtype_and_optional_parameters(weights):
    # A transposed bfloat16 input with float parameters: the CPU's mixed-type loop.
    x = torch.randn(8, 6).to(torch.bfloat16).t()
    w = torch.randn(8) if weights == "weight" else None
    b = torch.randn(8) if weights == "bias" else None
    want = torch.native_layer_norm(x, (8,), w, b, 1e-5)
    dev = lambda t: None if t is None else t.to("mydev")
    got = torch.native_layer_norm(dev(x), (8,), dev(w), dev(b), 1e-5)
    _assert_same([t.cpu() for t in got], list(want))


def test_queued_after_other_work_without_the_host_kernel():
    x = torch.randn(64, 768, device="mydev")
    ln = torch.nn.LayerNorm(768, device="mydev")
    s = torch.mydev.default_stream()
    with torch.no_grad(), delayed(s):
        out = ln(x)
        pending = not s.query()
    assert pending
    torch.testing.assert_close(out.cpu(), F.layer_norm(x.cpu(), (768,)), rtol=0, atol=0)
    with torch.no_grad():
        _, calls = host_kernel_calls(lambda: (ln(x), ln(x[:1])))  # queued, and short at the call
    assert calls == 0


BAD = [
    (lambda d: torch.native_layer_norm(torch.randn(3, 4, device=d), (5,), None, None, 1e-5),
     RuntimeError, "expected input with shape"),
    (lambda d: torch.native_layer_norm(torch.randn(3, 4, device=d), (4,), torch.randn(4, dtype=torch.float64,
                                                                                      device=d), None, 1e-5),
     RuntimeError, "mixed dtype"),
    (lambda d: torch.native_layer_norm(torch.randn(3, 4, device=d), (4,), torch.randn(5, device=d), None, 1e-5),
     RuntimeError, "Expected weight to be of same shape"),
    (lambda d: torch.native_layer_norm(torch.ones(3, 4, dtype=torch.long, device=d), (4,), None, None, 1e-5),
     NotImplementedError, "not implemented for 'Long'"),
]


@pytest.mark.parametrize("fn,error,match", BAD)
def test_errors_come_at_the_call_like_the_cpu(fn, error, match):
    with pytest.raises(error, match=match):
        fn("cpu")
    keep = torch.arange(6.0, device="mydev")
    with delayed(torch.mydev.default_stream()):
        with pytest.raises(error, match=match):
            fn("mydev")
    torch.mydev.synchronize()
    assert keep.cpu().tolist() == list(range(6))


def test_parameters_on_another_device_are_refused_at_the_call():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.native_layer_norm(torch.randn(3, 4, device="mydev"), (4,), torch.randn(4), None, 1e-5)


@pytest.mark.slow
def test_strict_mode(python_subprocess):
    # MYDEV_STRICT=1: a kernel reading device memory at its device address crashes.
    r = python_subprocess("""
        import torch, my_device
        g = torch.Generator().manual_seed(0)
        for shape in ((1, 1, 128), (64, 768)):
            x = torch.randn(shape, generator=g)
            w = torch.randn(shape[-1], generator=g)
            want = torch.native_layer_norm(x.transpose(-1, -2).contiguous().transpose(-1, -2), shape[-1:], w, None, 1e-5)
            got = torch.native_layer_norm(x.transpose(-1, -2).contiguous().transpose(-1, -2).to("mydev"), shape[-1:], w.to("mydev"), None, 1e-5)
            for a, b in zip(got, want):
                assert torch.equal(a.cpu(), b)
        print("ok")
    """, env={"MYDEV_STRICT": "1"}, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr[-3000:]
