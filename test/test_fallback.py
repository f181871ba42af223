"""The copying CPU fallback: counted, warns once per op, can be made an error, never serves views."""
import pytest
import torch

import my_device

# Every aten op with a CPU kernel has a mydev kernel, so the fallback's users are
# ops from other libraries that only ship a CPU kernel, like this one. The same
# source defines it in subprocesses.
CPU_ONLY_OP_SOURCE = """
import torch
_cpu_only_lib = torch.library.Library("mydev_test", "DEF")
_cpu_only_lib.define("cpu_only_hypot(Tensor a, Tensor b) -> Tensor")
_cpu_only_lib.impl("cpu_only_hypot", lambda a, b: torch.hypot(a, b), "CPU")
"""
exec(CPU_ONLY_OP_SOURCE)
FALLBACK_OP = "mydev_test::cpu_only_hypot"


def cpu_only_hypot(a, b):
    return torch.ops.mydev_test.cpu_only_hypot(a, b)


def _run():
    a, b = torch.randn(5), torch.randn(5)
    return cpu_only_hypot(a.to("mydev"), b.to("mydev")), torch.hypot(a, b)


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
    # torch.ops calls do not turn C++ warnings into Python ones, so the warning
    # reaches stderr (aten calls through torch.* become Python warnings).
    r = python_subprocess(CPU_ONLY_OP_SOURCE + """
import my_device
for _ in range(3):
    torch.ops.mydev_test.cpu_only_hypot(torch.randn(2, device="mydev"), torch.randn(2, device="mydev"))
""")
    assert r.returncode == 0, r.stderr
    warnings_seen = [line for line in r.stderr.splitlines() if "'mydev_test::cpu_only_hypot'" in line]
    assert len(warnings_seen) == 1, r.stderr
    assert "copying fallback" in warnings_seen[0] and "MYDEV_FALLBACK=error" in warnings_seen[0]


def test_error_mode_names_the_op_and_loses_nothing(monkeypatch):
    monkeypatch.setenv("MYDEV_FALLBACK", "error")
    x = torch.randn(3, device="mydev")
    kept = x.cpu()
    with pytest.raises(NotImplementedError, match="mydev_test::cpu_only_hypot.*MYDEV_FALLBACK=error"):
        cpu_only_hypot(x, x)
    torch.testing.assert_close(x.cpu(), kept)
    torch.testing.assert_close((x * 2).cpu(), kept * 2)


def test_bad_mode_is_reported_and_taken_as_warn(monkeypatch, capfd):
    # As the runtime's variables: said once on stderr (at load, or here at the first fallback).
    monkeypatch.setenv("MYDEV_FALLBACK", "sometimes")
    a, b = torch.randn(2), torch.randn(2)
    got = cpu_only_hypot(a.to("mydev"), b.to("mydev"))
    torch.testing.assert_close(got.cpu(), cpu_only_hypot(a, b))
    assert 'ignoring invalid MYDEV_FALLBACK="sometimes"; using warn' in capfd.readouterr().err


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


def test_track_fallbacks_records_ops_dtypes_and_shapes(monkeypatch):
    monkeypatch.setenv("MYDEV_FALLBACK", "silent")
    a32, b32 = torch.randn(2, 3, device="mydev"), torch.randn(2, 3, device="mydev")
    a64, b64 = torch.randn(4, dtype=torch.float64, device="mydev"), torch.randn(4, dtype=torch.float64, device="mydev")
    cpu_only_hypot(a32, b32)  # before the block: not recorded
    with my_device.track_fallbacks() as fb:
        for _ in range(2):
            out = cpu_only_hypot(a32, b32)
        cpu_only_hypot(a64, b64)
        (a32 + b32).relu().sum().item()  # native ops: not recorded
    cpu_only_hypot(a32, b32)  # after the block: not recorded
    torch.testing.assert_close(out.cpu(), torch.hypot(a32.cpu(), b32.cpu()))
    assert fb.counts() == {FALLBACK_OP: 3}
    assert sorted(fb.records, key=lambda r: r.calls) == [
        (FALLBACK_OP, ((torch.float64, (4,)), (torch.float64, (4,))), 1),
        (FALLBACK_OP, ((torch.float32, (2, 3)), (torch.float32, (2, 3))), 2),
    ]
    table = fb.summary()
    assert FALLBACK_OP in table and "float32[2, 3], float32[2, 3]" in table and "float64[4]" in table
    assert "3 calls of 1 op" in table


def test_track_fallbacks_nests_and_is_empty_without_fallbacks(monkeypatch):
    monkeypatch.setenv("MYDEV_FALLBACK", "silent")
    x = torch.randn(3, device="mydev")
    with my_device.track_fallbacks() as outer:
        cpu_only_hypot(x, x)
        with my_device.track_fallbacks() as inner:
            cpu_only_hypot(x, x)
        with my_device.track_fallbacks() as clean:
            (x * 2).cpu()
    assert outer.counts() == {FALLBACK_OP: 2}
    assert inner.counts() == {FALLBACK_OP: 1}
    assert not clean and clean.counts() == {} and "No op" in clean.summary()
    with my_device.track_fallbacks() as later:  # nothing left over from closed trackers
        pass
    assert later.records == []
