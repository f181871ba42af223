"""lerp, addcmul and addcdiv on single mydev tensors (csrc/native/PointwiseOps.cpp) against the CPU."""
import pytest
import torch

import my_device

from conftest import host_kernel_calls

CASES = {
    "lerp_scalar_low": lambda a, b, c: torch.lerp(a, b, 0.3),
    "lerp_scalar_high": lambda a, b, c: torch.lerp(a, b, 0.8),
    "lerp_tensor": lambda a, b, c: torch.lerp(a, b, c),
    "addcmul": lambda a, b, c: torch.addcmul(a, b, c, value=-0.5),
    "addcdiv": lambda a, b, c: torch.addcdiv(a, b, c, value=2),
    "lerp_scalar_": lambda a, b, c: a.clone().lerp_(b, 0.1),
    "lerp_tensor_": lambda a, b, c: a.clone().lerp_(b, c),
    "addcmul_": lambda a, b, c: a.clone().addcmul_(b, c, value=0.25),
    "addcdiv_": lambda a, b, c: a.clone().addcdiv_(b, c),
}


@pytest.mark.parametrize("shape", [(4, 16), (3000, 2), (128, 128)], ids=["small", "short_limit", "queued"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_cpu_on_the_structured_path(name, dtype, shape):
    torch.manual_seed(0)
    a, b = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    c = torch.rand(shape, dtype=dtype) + 0.5  # a divisor away from 0, a weight around 1
    want = CASES[name](a, b, c)
    got, host_calls = host_kernel_calls(lambda: CASES[name](a.to("mydev"), b.to("mydev"), c.to("mydev")))
    # The same CPU loops on the same values: bit for bit. clone has a kernel of its own.
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    assert host_calls == 0


def test_broadcast_and_mixed_dtypes_match_cpu():
    torch.manual_seed(0)
    a, b, c = torch.randn(4, 1), torch.randn(1, 5), torch.randn(5)
    for fn in (lambda x, y, z: torch.addcmul(x, y, z), lambda x, y, z: torch.lerp(x.expand(4, 5), y, 0.5)):
        torch.testing.assert_close(fn(a.to("mydev"), b.to("mydev"), c.to("mydev")).cpu(), fn(a, b, c))
    # Mixed dtypes take the host kernel, which promotes as the CPU does.
    d = torch.randn(5, dtype=torch.float64)
    got = torch.addcmul(a.to("mydev"), b.to("mydev"), d.to("mydev"))
    torch.testing.assert_close(got.cpu(), torch.addcmul(a, b, d))


@pytest.mark.parametrize("call", [
    lambda a, b: torch.lerp(a, b, 1e300),
    lambda a, b: a.addcmul_(b, b, value=1e300),
    lambda a, b: torch.addcdiv(a, b, b, value=1j),
    lambda a, b: torch.lerp(a, b.double(), 0.5),
    lambda a, b: a.addcmul_(b, torch.ones(3)),
], ids=["weight_overflow", "value_overflow", "complex_value", "lerp_dtypes", "shapes"])
def test_errors_are_the_cpus_at_the_call_and_lose_nothing(call):
    torch.manual_seed(0)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with pytest.raises(Exception) as cpu_error:
        call(a.clone(), b)
    x = a.to("mydev")
    with pytest.raises(type(cpu_error.value)) as err:
        call(x, b.to("mydev"))
    assert str(err.value).split("\n")[0] == str(cpu_error.value).split("\n")[0]
    torch.mydev.synchronize()  # nothing is left to raise later
    torch.testing.assert_close(x.cpu(), a)  # nothing was written
    torch.testing.assert_close(torch.lerp(x, x * 2, 0.5).cpu(), torch.lerp(a, a * 2, 0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gelu_gives_the_cpus_bits(dtype):
    # The CPU takes oneDNN's exact gelu (forward and backward) for contiguous float and bfloat16
    # inputs, whose results differ from ATen's own loop in the last bits.
    x = torch.randn(4, 32, 128).to(dtype).requires_grad_()
    d = x.detach().to("mydev").requires_grad_()
    y, yd = torch.nn.functional.gelu(x), torch.nn.functional.gelu(d)
    g = torch.randn_like(y)
    y.backward(g)
    yd.backward(g.to("mydev"))
    assert torch.equal(yd.detach().cpu(), y.detach())
    assert torch.equal(d.grad.cpu(), x.grad)
    # a strided gradient: the CPU looks at the input only
    gt = torch.randn(4, 128, 32).to(dtype).transpose(1, 2)
    assert torch.equal(torch.ops.aten.gelu_backward(gt.to("mydev"), d.detach()).cpu(),
                       torch.ops.aten.gelu_backward(gt, x.detach()))
    # tanh approximation and strided inputs take ATen's loop on the CPU too
    for approximate in ("none", "tanh"):
        xt = x.detach().transpose(1, 2)
        assert torch.equal(torch.nn.functional.gelu(xt.to("mydev"), approximate=approximate).cpu(),
                           torch.nn.functional.gelu(xt, approximate=approximate))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("exponent", [3.0, 2, 0.5, -1.5, 0, 1, 3])
def test_pow_of_a_tensor_by_a_number_like_cpu(dtype, exponent):
    # pow.Tensor_Scalar (GELU's cube in GPT-2's MLP) is a structured kernel of its own; exponents 0
    # and 1, and results of another dtype than the base, take the host kernel.
    x = (torch.randn(16, 33) * 3).to(dtype)
    ref = torch.pow(x, exponent)
    got, host_calls = host_kernel_calls(lambda: torch.pow(x.to("mydev"), exponent))
    assert got.dtype == ref.dtype
    torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0, equal_nan=True)
    own_kernel = exponent not in (0, 1) and torch.result_type(x, exponent) == dtype
    assert (host_calls == 0) == own_kernel, host_calls
