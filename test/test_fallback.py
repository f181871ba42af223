"""The copying CPU fallback: counted, warns once per op, can be made an error, never serves views."""
import warnings

import pytest
import torch

import my_device

# An op with a CPU kernel that csrc/native does not register: it can only run
# through the fallback. If it ever gets a native kernel, pick another.
FALLBACK_OP = "aten::logaddexp.out"  # the functional form decomposes to it


def _run():
    a, b = torch.randn(5), torch.randn(5)
    return torch.logaddexp(a.to("mydev"), b.to("mydev")), torch.logaddexp(a, b)


def test_fallback_counts_and_matches_cpu(monkeypatch):
    monkeypatch.setenv("MYDEV_FALLBACK", "silent")
    my_device.reset_fallback_counts()
    for _ in range(3):
        dev, cpu = _run()
        assert dev.device.type == "mydev"
        torch.testing.assert_close(dev.cpu(), cpu)
    assert my_device.fallback_counts() == {FALLBACK_OP: 3}
    my_device.reset_fallback_counts()
    assert my_device.fallback_counts() == {}


def test_native_ops_are_not_counted():
    my_device.reset_fallback_counts()
    x = torch.randn(4, 4, device="mydev")
    (x @ x).relu().sum().item()
    assert my_device.fallback_counts() == {}


def test_warns_once_per_op(python_subprocess):
    r = python_subprocess("""
        import warnings, torch, my_device
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(3):
                torch.logaddexp(torch.randn(2, device="mydev"), torch.randn(2, device="mydev"))
        msgs = [str(x.message) for x in w if "aten::logaddexp" in str(x.message)]
        print(len(msgs))
        print(msgs[0] if msgs else "")
    """)
    assert r.returncode == 0, r.stderr
    count, message = r.stdout.strip().split("\n", 1)
    assert count == "1"
    assert "copying fallback" in message and "MYDEV_FALLBACK=error" in message


def test_error_mode_names_the_op_and_loses_nothing(monkeypatch):
    monkeypatch.setenv("MYDEV_FALLBACK", "error")
    x = torch.randn(3, device="mydev")
    kept = x.cpu()
    with pytest.raises(NotImplementedError, match="aten::logaddexp.*MYDEV_FALLBACK=error"):
        torch.logaddexp(x, x)
    torch.testing.assert_close(x.cpu(), kept)
    torch.testing.assert_close((x * 2).cpu(), kept * 2)


def test_bad_mode_is_rejected(monkeypatch):
    monkeypatch.setenv("MYDEV_FALLBACK", "sometimes")
    with pytest.raises(RuntimeError, match="MYDEV_FALLBACK must be one of"):
        torch.logaddexp(torch.randn(2, device="mydev"), torch.randn(2, device="mydev"))


def test_view_ops_never_fall_back(monkeypatch):
    monkeypatch.setenv("MYDEV_FALLBACK", "error")
    x = torch.randn(4, 6, device="mydev")
    views = [x.view(6, 4), x.t(), x[1:, ::2], x.unsqueeze(0), x.squeeze(), x.expand(2, 4, 6), x.narrow(1, 1, 2),
             x.permute(1, 0), x.unfold(1, 2, 2), x.diagonal(), x.view(torch.int32), x.reshape(24),
             x.unflatten(1, (2, 3)), x.movedim(0, 1), x.select(0, 1), x.split(2)[1], x.chunk(3, 1)[0],
             x.as_strided((2, 2), (1, 2)), x.detach(), x.real, x.view_as(x)]
    for v in views:
        assert torch._C._is_alias_of(v, x), v.shape
        assert my_device.impl_type_name(v) == "my_device::MyDevTensorImpl"
