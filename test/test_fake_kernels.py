"""Fake (meta) kernels answer for mydev tensors as for the CPU's, whose kernels mydev runs
(my_device/_cpu_like_refs.py): what torch.compile plans is what the kernel makes."""
import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import my_device  # noqa: F401

MODES = {"sum": 0, "mean": 1, "max": 2}


def _bag_inputs(device):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(10, 3, generator=g)
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offsets = torch.tensor([0, 3, 5])
    return weight.to(device), indices.to(device), offsets.to(device)


def _fake_and_real_shapes(mode):
    real = torch.ops.aten._embedding_bag(*_bag_inputs("mydev"), False, MODES[mode])
    FakeTensorMode.cache_clear()  # (its dispatch cache would answer from an earlier run)
    with FakeTensorMode(allow_non_fake_inputs=False) as fake_mode:
        inputs = [fake_mode.from_tensor(t) for t in _bag_inputs("mydev")]
        fake = torch.ops.aten._embedding_bag(*inputs, False, MODES[mode])
    return [tuple(t.shape) for t in fake], [tuple(t.shape) for t in real]


@contextlib.contextmanager
def _torch_device_hint():
    import torch._meta_registrations as meta

    patched = meta.device_hint
    assert getattr(patched, "_torch_original", None) is not None
    meta.device_hint = patched._torch_original
    try:
        yield
    finally:
        meta.device_hint = patched


@pytest.mark.parametrize("mode", list(MODES))
def test_embedding_bag_fake_outputs_have_the_kernels_shapes(mode):
    fake, real = _fake_and_real_shapes(mode)
    assert fake == real


@pytest.mark.parametrize("mode", list(MODES))
def test_compiled_embedding_bag_trains_as_on_the_cpu(mode):
    def step(weight, indices, offsets):
        out = F.embedding_bag(indices, weight, offsets, mode=mode)
        (out * out).sum().backward()
        return out

    results = {}
    for device in ("cpu", "mydev"):
        weight, indices, offsets = _bag_inputs(device)
        weight.requires_grad_()
        torch._dynamo.reset()
        fn = torch.compile(step) if device == "mydev" else step
        out = fn(weight, indices, offsets)
        results[device] = (out.detach().cpu(), weight.grad.cpu())
    torch._dynamo.reset()
    for got, want in zip(results["mydev"], results["cpu"]):
        torch.testing.assert_close(got, want)


def test_device_hint_workaround_still_needed():
    # my_device/_cpu_like_refs.py answers "cpu" for mydev in torch._meta_registrations.device_hint. When this
    # test fails, torch's meta kernels give mydev the CPU kernel's shapes by themselves: remove the workaround.
    with _torch_device_hint():
        fake, real = _fake_and_real_shapes("sum")
    assert fake != real, fake
