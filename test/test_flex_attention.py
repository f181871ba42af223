"""flex_attention on mydev: eager (torch's math reference) and compiled (Inductor's C++ template), against
the CPU, inference only as on the CPU."""
import pytest
import torch
from torch._inductor.utils import fresh_cache
from torch.nn.attention import flex_attention as flex

import my_device  # noqa: F401
from test_inductor import _torch_original

DEV = "mydev"


def _causal(b, h, q, k):
    return q >= k


def _relative_bias(score, b, h, q, k):
    return score + (q - k) * 0.01


def _inputs(device):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 32, generator=gen).to(device) for _ in range(3))
    return q, k, v, flex.create_block_mask(_causal, 2, 4, 64, 64, device=device)


def _attend(fn, device):
    q, k, v, mask = _inputs(device)
    return fn(q, k, v, score_mod=_relative_bias, block_mask=mask).cpu()


def test_eager_flex_attention_gives_the_cpus_bits():
    assert torch.equal(_attend(flex.flex_attention, DEV), _attend(flex.flex_attention, "cpu"))


def test_compiled_flex_attention_matches_the_cpu():
    torch._dynamo.reset()
    with fresh_cache():
        compiled = _attend(torch.compile(flex.flex_attention), DEV)
        torch._dynamo.reset()
        cpu_compiled = _attend(torch.compile(flex.flex_attention), "cpu")
    torch.testing.assert_close(compiled, cpu_compiled)
    torch.testing.assert_close(compiled, _attend(flex.flex_attention, "cpu"))


def test_a_backward_is_refused_as_on_the_cpu_and_loses_nothing():
    q, k, v, _ = _inputs(DEV)
    for device in ("cpu", DEV):
        with pytest.raises(NotImplementedError, match="does not support backward"):
            flex.flex_attention(q.to(device, copy=True).requires_grad_(), k.to(device), v.to(device))
    torch.testing.assert_close(flex.flex_attention(q, k, v).cpu(), flex.flex_attention(q.cpu(), k.cpu(), v.cpu()))


def test_flex_attention_workaround_still_needed():
    # my_device/_flex_attention.py asks flex_attention's checks about mydev inputs as about CPU ones. When this
    # test fails, torch lists mydev or asks the backend: remove the workaround.
    with _torch_original(flex, "_validate_device"):
        with pytest.raises(ValueError, match="only supported on"):
            _attend(flex.flex_attention, DEV)
    with _torch_original(flex, "_apply_kernel_options"):
        q, k, v, _ = _inputs(DEV)
        options = flex._apply_kernel_options(q, k, v, False, None)
    assert options["OUTPUT_LOGSUMEXP"], "torch no longer asks a mydev kernel for the log-sum-exp"


def test_flex_attention_lowering_workaround_still_needed():
    # my_device/inductor/backend.py gives the flex_attention lowering a "cpu" constant that also equals "mydev".
    # When this test fails, torch decides by the backend: remove the workaround.
    from torch._higher_order_ops.flex_attention import flex_attention

    from my_device.inductor.backend import _lowering_cell

    torch._dynamo.reset()
    with _torch_original(_lowering_cell(flex_attention), "cell_contents"), fresh_cache():
        # (the GPU template's path: here it asks for CUDA)
        with pytest.raises(Exception, match="CUDA|[Tt]riton"):
            with torch.no_grad():
                _attend(torch.compile(flex.flex_attention), DEV)
