"""Small behaviours a CPU or CUDA user relies on: error types and messages, settings
that change what kernels produce (deterministic mode, the default dtype), and the
torch.cuda-style names (storage classes), each checked against the CPU."""
import re
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import my_device

from conftest import delayed


def cpu_and_mydev_raise_alike(fn):
    """fn(device) raises the same exception type on both; returns the two exceptions."""
    errors = []
    for device in ("cpu", "mydev"):
        with pytest.raises(Exception) as info:
            fn(device)
            torch.mydev.synchronize()
        errors.append(info.value)
    assert type(errors[1]) is type(errors[0]), errors
    return errors


@pytest.mark.parametrize("op", [torch.min, torch.max, torch.amax, torch.argmax])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_a_full_reduction_of_an_empty_tensor_raises_as_on_cpu(op, dtype):
    cpu_error, mydev_error = cpu_and_mydev_raise_alike(lambda d: op(torch.empty(0, dtype=dtype, device=d)))
    assert str(cpu_error).split("\n")[0] in str(mydev_error)
    assert op(torch.arange(3, dtype=dtype, device="mydev")).item() == op(torch.arange(3, dtype=dtype)).item()


def hold(stream, us=20_000):
    """Holds `stream`'s worker back `us` before each task (0: releases it), without synchronising."""
    my_device._C._test_set_stream_delay(stream.stream_id, stream.device_index, us)


def test_a_second_queued_failure_is_reported_by_the_next_synchronisation():
    x = torch.randn(2, 5)
    d = x.to("mydev")
    s = torch.mydev.current_stream()
    F.nll_loss(d, torch.tensor([0, 1], device="mydev"))  # (the signature's first call runs at the call)
    torch.mydev.synchronize()
    hold(s)
    F.nll_loss(d, torch.tensor([0, 7], device="mydev"))
    F.nll_loss(d, torch.tensor([9, 0], device="mydev"))
    hold(s, 0)
    # Each with the CPU's type and message, one per synchronisation.
    with pytest.raises(IndexError, match="Target 7 is out of bounds"):
        torch.mydev.synchronize()
    with pytest.raises(IndexError, match="Target 9 is out of bounds"):
        torch.mydev.synchronize()
    torch.mydev.synchronize()
    t = torch.tensor([1, 4])
    torch.testing.assert_close(F.nll_loss(d, t.to("mydev")).cpu(), F.nll_loss(x, t))


@pytest.mark.parametrize("how", ["stream.query", "event.query", "event.synchronize"])
def test_stream_and_event_queries_report_a_failed_kernel(how):
    d = torch.randn(2, 5, device="mydev")
    s = torch.mydev.current_stream()
    F.nll_loss(d, torch.tensor([0, 1], device="mydev"))
    torch.mydev.synchronize()
    hold(s)
    F.nll_loss(d, torch.tensor([0, 7], device="mydev"))
    event = torch.mydev.Event()
    event.record()
    hold(s, 0)
    with pytest.raises(IndexError, match="Target 7 is out of bounds"):
        if how == "stream.query":
            while not s.query():
                pass
        elif how == "event.query":
            while not event.query():
                pass
        else:
            event.synchronize()
    torch.mydev.synchronize()                  # reported once
    assert s.query() and event.query()


def test_out_on_another_device_is_refused_even_when_zero_dim():
    a = torch.ones(3, device="mydev")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.add(a, a, out=torch.empty((), device="cpu"))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.zeros((), device="cpu").atan2_(torch.ones((), device="mydev"))
    # A 0-dim host tensor read as a scalar is still fine.
    torch.testing.assert_close(torch.add(a, torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))


def test_deterministic_mode_fills_new_memory_and_is_the_callers_at_the_call():
    try:
        torch.use_deterministic_algorithms(True)
        for dtype in (torch.float32, torch.int32, torch.float16):
            for make in (lambda d: torch.empty(4, dtype=dtype, device=d),
                         lambda d: torch.empty_strided((2, 2), (1, 2), dtype=dtype, device=d),
                         lambda d: torch.ones(2, dtype=dtype, device=d).resize_(6)):
                assert torch.equal(make("mydev").cpu(), make("cpu"), ) or \
                    (dtype.is_floating_point and torch.equal(make("mydev").cpu().isnan(), make("cpu").isnan()))
        # A kernel that obeys the mode follows the caller's setting at the call,
        # even if the caller switches it off before reading the result.
        results = {}
        for d in ("cpu", "mydev"):
            torch.use_deterministic_algorithms(True)
            idx = torch.tensor([0, 0, 1, 1, 2], device=d)
            with delayed(torch.mydev.current_stream(), 5_000):
                r = torch.zeros(5, device=d).index_copy_(0, idx, torch.arange(5.0, device=d))
                torch.use_deterministic_algorithms(False)
            results[d] = r.cpu()
        torch.testing.assert_close(results["mydev"], results["cpu"])
    finally:
        torch.use_deterministic_algorithms(False)


def test_default_dtype_is_part_of_a_calls_signature():
    b, i = torch.tensor([True, False]), torch.arange(3)
    try:
        for dtype in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(dtype)
            for _ in range(2):
                assert (b.to("mydev") / b.to("mydev")).dtype == (b / b).dtype == dtype
                assert (i.to("mydev") / 2.0).dtype == (i / 2.0).dtype == dtype
    finally:
        torch.set_default_dtype(torch.float32)


def test_complex_half_warns_as_on_cpu():
    # The warning is given once per process, as CPU's is: checked in a fresh one.
    code = ("import warnings, torch, my_device\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    torch.empty(3, dtype=torch.chalf, device='mydev')\n"
            "print([str(x.message) for x in w])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "ComplexHalf support is experimental" in r.stdout, r.stdout + r.stderr


def test_a_host_generator_is_refused_by_device_ops():
    with pytest.raises(RuntimeError, match="Expected a 'mydev' device type for generator but found 'cpu'"):
        torch.randn(3, device="mydev", generator=torch.Generator())
    g = torch.Generator(device="mydev").manual_seed(3)
    assert torch.randn(3, device="mydev", generator=g).shape == (3,)


def test_record_stream_refuses_a_stream_of_another_device_type():
    x = torch.ones(3, device="mydev")
    with pytest.raises(RuntimeError, match="expected a mydev stream"):
        x.record_stream(torch.Stream("cpu"))
    x.record_stream(torch.mydev.Stream())


def test_an_invalid_fallback_setting_is_reported_at_load():
    r = subprocess.run([sys.executable, "-c", "import torch, my_device; print(torch.ones(2, device='mydev').sum().item())"],
                       capture_output=True, text=True, timeout=120, env={**__import__("os").environ, "MYDEV_FALLBACK": "bogus"})
    assert r.returncode == 0 and r.stdout.strip() == "2.0", r.stderr
    assert 'ignoring invalid MYDEV_FALLBACK="bogus"' in r.stderr


@pytest.mark.parametrize("fn", [
    lambda d: torch.arange(6, device=d).to(torch.uint16) * 2,
    lambda d: torch.arange(3, dtype=torch.uint8, device=d) + 1000,   # wraps around, as on CPU
    lambda d: torch.arange(3, dtype=torch.int8, device=d) * 300,
], ids=["uint16*2", "uint8+1000", "int8*300"])
def test_integer_arithmetic_with_python_numbers_matches_cpu(fn):
    assert torch.equal(fn("mydev").cpu(), fn("cpu"))


@pytest.mark.parametrize("number", [0.5, -3, 2 + 1j, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.complex64, torch.bfloat16])
def test_arithmetic_with_each_kind_of_python_number_matches_cpu(dtype, number):
    # A Python number reaches the op as a wrapped 0-dim CPU tensor, which mydev converts to the tensor's dtype
    # first where the CPU's loop would: sub's refusal of a bool must still come.
    x = (torch.arange(6) - 2).to(dtype)
    for op in (torch.mul, torch.add, torch.sub, lambda a, n: n - a):
        try:
            want = op(x, number)
        except RuntimeError as e:
            with pytest.raises(RuntimeError, match=re.escape(str(e).splitlines()[0][:40])):
                op(x.to("mydev"), number)
            continue
        got = op(x.to("mydev"), number).cpu()
        assert got.dtype == want.dtype and torch.equal(got, want), (op, got, want)


@pytest.mark.parametrize("dst,src", [((8, 0), (3, 0)), ((0,), (3, 0)), ((3, 0), (2, 3, 0)), ((3, 0), (1, 0))])
def test_copy_from_an_empty_source_checks_the_shapes(dst, src):
    def copy(d):
        return torch.empty(dst, device=d).copy_(torch.empty(src, device=d))
    try:
        copy("cpu")
    except RuntimeError:
        cpu_error, mydev_error = cpu_and_mydev_raise_alike(copy)
        assert str(mydev_error) == str(cpu_error)
    else:
        assert copy("mydev").shape == dst


def test_storage_classes_as_torch_cuda_has_them():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # (typed storages are deprecated in PyTorch)
        t = torch.randn(3, device="mydev")
        assert t.storage_type() is torch.mydev.FloatStorage
        assert isinstance(t.storage(), torch.mydev.FloatStorage)
        assert not isinstance(t.storage(), torch.FloatStorage)
        assert torch.arange(3, device="mydev").storage_type() is torch.mydev.LongStorage
        s = torch.mydev.HalfStorage(4)
        assert s.device.type == "mydev" and s.dtype == torch.float16 and len(s) == 4


def test_batch_norm_lays_out_its_output_as_the_cpu_does():
    x = torch.randn(4, 3, 5, 6).transpose(2, 3)
    d = x.to("mydev")
    args = [torch.zeros(3), torch.ones(3)]
    want = F.batch_norm(x, *args, training=True)
    for _ in range(2):                           # at the call, then queued
        got = F.batch_norm(d, *[a.to("mydev") for a in args], training=True)
        assert got.stride() == want.stride()
        torch.testing.assert_close(got.view(-1).cpu(), want.view(-1))
