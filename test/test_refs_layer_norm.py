"""native_layer_norm's statistics on mydev: eager, FakeTensor (torch.compile) and PyTorch's reference agree."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import my_device  # noqa: F401


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_eager_fake_and_reference_statistics_agree(dtype):
    x = torch.randn(2, 3, 8, dtype=dtype)
    w, b = torch.randn(8, dtype=dtype), torch.randn(8, dtype=dtype)
    cpu = torch.native_layer_norm(x, (8,), w, b, 1e-5)
    eager = torch.native_layer_norm(x.to("mydev"), (8,), w.to("mydev"), b.to("mydev"), 1e-5)
    ref = torch._refs.native_layer_norm(x.to("mydev"), (8,), w.to("mydev"), b.to("mydev"), 1e-5)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = torch.native_layer_norm(mode.from_tensor(x.to("mydev")), (8,), mode.from_tensor(w.to("mydev")),
                                       mode.from_tensor(b.to("mydev")), 1e-5)
    for c, e, r, f in zip(cpu, eager, ref, fake):
        assert c.dtype == e.dtype == r.dtype == f.dtype
        assert e.shape == f.shape == c.shape
        torch.testing.assert_close(e.cpu(), c)
        torch.testing.assert_close(r.cpu(), c, atol=1e-2, rtol=1e-2)


def test_torch_reference_still_treats_only_cpu_as_cpu():
    """my_device/_cpu_like_refs.py converts the reference's statistics for mydev; when torch's own reference
    gives a mydev bfloat16 input bfloat16 statistics, remove it."""
    original = torch._refs.native_layer_norm._torch_original
    _, mean, rstd = original(torch.randn(2, 8, dtype=torch.bfloat16, device="mydev"), (8,), None, None, 1e-5)
    assert mean.dtype == rstd.dtype == torch.float32
