""".item() (aten::_local_scalar_dense, csrc/native/Copy.cpp) and where(condition, self, other)
(csrc/native/TensorCompare.cpp) against the CPU: values and their Python types for every dtype
the CPU reads, views, the errors, sync debug mode, a failed kernel before the read, strict mode,
and that the device works after an error."""
import warnings

import pytest
import torch

import my_device

from conftest import delayed, host_kernel_calls

aten = torch.ops.aten

# The dtypes the CPU's _local_scalar_dense reads.
ITEM_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex32,
    torch.complex64, torch.complex128, torch.float8_e5m2, torch.float8_e5m2fnuz, torch.float8_e4m3fn,
    torch.float8_e4m3fnuz, torch.float8_e8m0fnu,
]


def _values(dtype):
    """A few CPU tensors of `dtype` with values worth reading: signs, fractions, extremes."""
    if dtype == torch.bool:
        return [torch.tensor(True), torch.tensor(False)]
    if dtype in (torch.uint16, torch.uint32, torch.uint64):
        return [torch.tensor(7, dtype=dtype), torch.tensor(torch.iinfo(dtype).max, dtype=dtype)]
    if not dtype.is_floating_point and not dtype.is_complex:
        info = torch.iinfo(dtype)
        return [torch.tensor(v, dtype=dtype) for v in (0, 1, info.min, info.max)]
    if dtype.is_complex:
        return [torch.tensor(v).to(dtype) for v in (1.5 - 2.25j, -0.0 + 3j)]
    vals = [2.5, 0.375, 448.0]
    if dtype != torch.float8_e8m0fnu:   # (no sign bit, powers of two only)
        vals += [-1.75, -0.0]
    return [torch.tensor(v).to(dtype) for v in vals]


def _same_scalar(got, want):
    assert type(got) is type(want), (got, want)
    if isinstance(want, float) and want != want:
        assert got != got
    else:
        assert got == want, (got, want)
        if isinstance(want, float):
            assert str(got) == str(want)    # -0.0 stays -0.0


@pytest.mark.parametrize("dtype", ITEM_DTYPES, ids=str)
def test_item_of_every_dtype_matches_cpu(dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # complex32 is "experimental"
        for cpu in _values(dtype):
            for t in (cpu, cpu.reshape(1), cpu.reshape(1, 1)):     # 0-d, 1-element
                _same_scalar(t.to("mydev").item(), t.item())
                _same_scalar(aten._local_scalar_dense(t.to("mydev")), aten._local_scalar_dense(t))


def test_item_of_a_bool_byte_other_than_one_reads_true_as_cpu():
    raw = torch.tensor([2, 0], dtype=torch.uint8)
    for i in range(2):
        want = raw.view(torch.bool)[i].item()
        assert raw.to("mydev").view(torch.bool)[i].item() is want


def test_item_of_views_matches_cpu():
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    dev = base.to("mydev")
    views = [
        lambda t: t[2, 3],                      # 0-d view at an offset
        lambda t: t[1:2, 4],                    # 1 element of a column: non-contiguous, offset
        lambda t: t.t()[5:6, 3:4],              # transposed, 1x1
        lambda t: t[::3, ::5][1:2, 1],          # strided twice
        lambda t: t[3].expand(1, 6)[0, -1],     # an expanded view
    ]
    for view in views:
        _same_scalar(view(dev).item(), view(base).item())
    c = torch.tensor([1.5 - 2.0j, -3.0 + 0.5j], dtype=torch.complex64)
    dc = c.to("mydev")
    for view in (lambda t: t.conj()[1], lambda t: t[0].conj(), lambda t: t.conj().imag[1],
                 lambda t: t.conj().imag[0:1], lambda t: t.conj().real[1], lambda t: t[1:].conj().imag):
        assert view(dc).is_conj() == view(c).is_conj() and view(dc).is_neg() == view(c).is_neg()
        _same_scalar(view(dc).item(), view(c).item())


def test_item_errors_match_cpu_and_the_device_still_works():
    d = torch.arange(3.0, device="mydev")
    for shape in ((0,), (4, 0), (2, 3)):
        for call in (lambda t: t.item(), lambda t: aten._local_scalar_dense(t)):
            cpu = torch.arange(float(torch.Size(shape).numel())).reshape(shape) + 5
            try:
                want = call(cpu)
            except RuntimeError as e:
                with pytest.raises(RuntimeError) as info:
                    call(cpu.to("mydev"))
                assert str(info.value).splitlines()[0] == str(e).splitlines()[0]
            else:   # _local_scalar_dense of several elements reads the first, on the CPU too
                _same_scalar(call(cpu.to("mydev")), want)
    assert d[2].item() == 2.0 and (d + 1).sum().item() == 6.0


def test_item_reports_a_failed_kernel_queued_before_it():
    a = torch.arange(5.0, device="mydev")
    my_device._C._test_inject_kernel_failure("aten::mul.Tensor")
    b = (a * 3)[4]
    with pytest.raises(RuntimeError, match=r"aten::mul\.Tensor: injected failure"):
        b.item()
    torch.mydev.synchronize()   # reported once
    assert (a * 3)[4].item() == 12.0


def test_item_waits_for_the_kernel_that_writes_its_element():
    x = torch.full((4096,), 2.0, device="mydev")
    s = torch.mydev.default_stream()
    with delayed(s, us=20_000):
        y = (x * 3).sum()
        assert not s.query()     # still queued
        assert y.item() == 4096 * 6.0


def test_item_in_sync_debug_mode_warns_or_raises():
    x = torch.randn(8, device="mydev")
    want = x.cpu()[3].item()
    try:
        torch.mydev.set_sync_debug_mode("warn")
        with pytest.warns(UserWarning, match="called a synchronizing mydev operation"):
            v = x[3].item()
        assert v == want
        torch.mydev.set_sync_debug_mode("error")
        with pytest.raises(RuntimeError, match="called a synchronizing mydev operation"):
            x[3].item()
    finally:
        torch.mydev.set_sync_debug_mode("default")
    assert x[3].item() == want


# -- where ---------------------------------------------------------------------------------------

WHERE_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                torch.int8, torch.uint8, torch.bool, torch.complex64]


def _rand(shape, dtype, gen):
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=gen)
    if not dtype.is_floating_point:
        return torch.randint(0, 100, shape, generator=gen).to(dtype)
    return torch.randn(shape, generator=gen).to(dtype)


@pytest.mark.parametrize("shape", [(4, 16), (300, 300)], ids=["short", "queued"])
@pytest.mark.parametrize("dtype", WHERE_DTYPES, ids=str)
def test_where_matches_cpu_on_its_own_kernel(dtype, shape):
    g = torch.Generator().manual_seed(0)
    cond, a, b = torch.rand(shape, generator=g) > 0.5, _rand(shape, dtype, g), _rand(shape, dtype, g)
    dc, da, db = cond.to("mydev"), a.to("mydev"), b.to("mydev")
    got, host_calls = host_kernel_calls(lambda: torch.where(dc, da, db))
    # where.self takes the TensorIterator kernel (a bool condition, one dtype), not the host kernel.
    assert host_calls == 0
    assert got.device == da.device and got.dtype == dtype
    torch.testing.assert_close(got.cpu(), torch.where(cond, a, b), rtol=0, atol=0)


def test_where_behind_queued_work_and_on_non_contiguous_operands():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(16, 8, generator=g), torch.randn(8, 16, generator=g)
    cond = torch.rand(8, 16, generator=g) > 0.3
    da, db, dc = a.to("mydev"), b.to("mydev"), cond.to("mydev")
    s = torch.mydev.default_stream()
    with delayed(s, us=20_000):
        x = da * 2                     # queued, held back
        got = torch.where(dc, x.t(), db[:, ::1])
        got2 = torch.where(dc[:, ::2], x.t()[:, ::2], db[:, 1::2])
        assert not s.query()
    torch.testing.assert_close(got.cpu(), torch.where(cond, (a * 2).t(), b))
    torch.testing.assert_close(got2.cpu(), torch.where(cond[:, ::2], (a * 2).t()[:, ::2], b[:, 1::2]))


@pytest.mark.parametrize("shapes", [((4, 1), (1, 16), (16,)), ((), (3, 5), ()), ((2, 1, 5), (3, 1), (1,)),
                                    ((0, 4), (1, 4), (4,))], ids=str)
def test_where_broadcasts_as_cpu(shapes):
    g = torch.Generator().manual_seed(2)
    cond = torch.rand(shapes[0], generator=g) > 0.5
    a, b = torch.randn(shapes[1], generator=g), torch.randn(shapes[2], generator=g)
    got, host_calls = host_kernel_calls(lambda: torch.where(cond.to("mydev"), a.to("mydev"), b.to("mydev")))
    assert host_calls == 0
    want = torch.where(cond, a, b)
    assert got.shape == want.shape and got.stride() == want.stride()
    torch.testing.assert_close(got.cpu(), want)


SCALAR_CASES = {
    "scalar_other": lambda c, a, b: torch.where(c, a, 0.5),
    "scalar_self": lambda c, a, b: torch.where(c, -2, a),
    "scalars": lambda c, a, b: torch.where(c, 1.0, 0.0),
    "int_scalars": lambda c, a, b: torch.where(c, 3, 4),
    "int_tensor_float_scalar": lambda c, a, b: torch.where(c, b, 1.5),
    "mixed_dtypes": lambda c, a, b: torch.where(c, a, b),
    "mixed_dtypes_double": lambda c, a, b: torch.where(c, a.double(), a),
    "zero_dim_other": lambda c, a, b: torch.where(c, a, torch.tensor(7.0, dtype=torch.float64)),
    "method": lambda c, a, b: a.where(c, b),
    "condition_only": lambda c, a, b: torch.where(c),
}


@pytest.mark.parametrize("name", list(SCALAR_CASES))
def test_where_overloads_and_promotion_match_cpu(name):
    g = torch.Generator().manual_seed(3)
    c, a = torch.rand(4, 6, generator=g) > 0.5, torch.randn(4, 6, generator=g)
    b = torch.randint(-5, 5, (4, 6), generator=g)
    args = (c, a, b)
    want = SCALAR_CASES[name](*args)
    got = SCALAR_CASES[name](*(t.to("mydev") for t in args))
    if isinstance(want, tuple):
        assert len(got) == len(want)
        for gw, w in zip(got, want):
            torch.testing.assert_close(gw.cpu(), w)
    else:
        assert got.dtype == want.dtype and got.device.type == "mydev"
        torch.testing.assert_close(got.cpu(), want)


def test_where_with_a_uint8_condition_warns_and_matches_cpu():
    g = torch.Generator().manual_seed(4)
    c, a, b = torch.randint(0, 3, (5,), generator=g).to(torch.uint8), torch.randn(5), torch.randn(5)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        want = torch.where(c, a, b)
        got = torch.where(c.to("mydev"), a.to("mydev"), b.to("mydev"))
    torch.testing.assert_close(got.cpu(), want)


def _error(fn):
    with pytest.raises(Exception) as info:
        fn()
    return type(info.value), str(info.value).splitlines()[0]


@pytest.mark.parametrize("cond_dtype", [torch.float32, torch.int64, torch.int8])
def test_where_non_bool_condition_error_matches_cpu_and_the_device_still_works(cond_dtype):
    c, a, b = torch.tensor([1, 0, 2]).to(cond_dtype), torch.randn(3), torch.randn(3)
    want = _error(lambda: torch.where(c, a, b))
    da, db = a.to("mydev"), b.to("mydev")
    assert _error(lambda: torch.where(c.to("mydev"), da, db)) == want
    torch.testing.assert_close(torch.where(da > 0, da, db).cpu(), torch.where(a > 0, a, b))
    assert (da + db).sum().item() == pytest.approx((a + b).sum().item(), rel=1e-6)


def test_where_shape_and_device_errors():
    c, a, b = torch.rand(4) > 0.5, torch.randn(4), torch.randn(5)
    want = _error(lambda: torch.where(c, a, b))
    dc, da, db = c.to("mydev"), a.to("mydev"), b.to("mydev")
    assert _error(lambda: torch.where(dc, da, db)) == want
    for args in ((dc, da, a), (c, da, da), (dc, a, da)):
        kind, msg = _error(lambda: torch.where(*args))
        assert kind is RuntimeError and "Expected all tensors to be on the same device" in msg, msg
    # A 0-d CPU tensor is allowed beside device tensors, as on CUDA.
    torch.testing.assert_close(torch.where(dc, da, torch.tensor(2.0)).cpu(), torch.where(c, a, torch.tensor(2.0)))
    torch.testing.assert_close(torch.where(dc, da, -da).cpu(), torch.where(c, a, -a))


def test_where_out_matches_cpu():
    g = torch.Generator().manual_seed(5)
    c, a, b = torch.rand(3, 4, generator=g) > 0.5, torch.randn(3, 4, generator=g), torch.randn(4, generator=g)
    want = torch.empty(0)
    torch.where(c, a, b, out=want)
    got = torch.empty(0, device="mydev")
    torch.where(c.to("mydev"), a.to("mydev"), b.to("mydev"), out=got)
    torch.testing.assert_close(got.cpu(), want)
    wrong = (lambda dev: torch.where(c.to(dev), a.to(dev), b.to(dev), out=torch.empty(3, 4, dtype=torch.float64,
                                                                                      device=dev)))
    assert _error(lambda: wrong("mydev")) == _error(lambda: wrong("cpu"))


def test_where_gradients_match_cpu():
    g = torch.Generator().manual_seed(6)
    c, a, b = torch.rand(4, 5, generator=g) > 0.5, torch.randn(4, 5, generator=g), torch.randn(5, generator=g)
    grads = []
    for dev in ("cpu", "mydev"):
        x, y = a.to(dev).detach().requires_grad_(), b.to(dev).detach().requires_grad_()
        (torch.where(c.to(dev), x, y) * torch.arange(5.0, device=dev)).sum().backward()
        grads.append((x.grad.cpu(), y.grad.cpu()))
    torch.testing.assert_close(grads[1], grads[0])


def test_item_and_where_in_strict_mode(python_subprocess):
    # In strict mode a device address faults on any host read: the element
    # must be read through the runtime, and where's kernel reach its operands
    # at their kernel addresses.
    r = python_subprocess("""
        import torch, my_device
        g = torch.Generator().manual_seed(0)
        for dtype in (torch.float32, torch.float64, torch.int64, torch.bool, torch.complex64, torch.bfloat16):
            t = torch.randn(3, generator=g).to(dtype)
            d = t.to("mydev")
            assert d[1].item() == t[1].item(), dtype
        z = torch.tensor([1 + 2j], dtype=torch.complex64)
        assert z.to("mydev").conj().imag.item() == z.conj().imag.item()
        c, a, b = torch.rand(64, 3, generator=g) > 0.5, torch.randn(64, 3, generator=g), torch.randn(3, generator=g)
        for shape in ((64, 3), (4000, 3)):
            c2, a2 = c.repeat(shape[0] // 64 + 1, 1)[:shape[0]], a.repeat(shape[0] // 64 + 1, 1)[:shape[0]]
            got = torch.where(c2.to("mydev"), a2.to("mydev"), b.to("mydev"))
            assert torch.equal(got.cpu(), torch.where(c2, a2, b))
        try:
            torch.empty(0, device="mydev").item()
        except RuntimeError as e:
            assert "0 elements" in str(e)
        assert torch.where(c.to("mydev"), 1.0, 0.0).sum().item() == c.sum().item()
        print("ok")
    """, env={"MYDEV_STRICT": "1"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("shape,fmt", [((2, 3, 4, 5), torch.channels_last), ((8, 3, 40, 50), torch.channels_last),
                                       ((2, 3, 4, 5, 6), torch.channels_last_3d)], ids=["short", "queued", "3d"])
def test_structured_kernels_on_channels_last_inputs_match_cpu(shape, fmt):
    # TensorIterator asks for an output of the inputs' memory format through
    # its options, without strides (its fast set-up): an output allocated
    # contiguous regardless was written in channels_last order (wrong values).
    g = torch.Generator().manual_seed(7)
    x = torch.randn(shape, generator=g).to(memory_format=fmt)
    c = x > 0.3
    dx, dc = x.to("mydev"), c.to("mydev")
    for fn in (lambda t, m: torch.where(m, t, -t), lambda t, m: t.clamp(-0.5, 0.5), lambda t, m: t + t,
               lambda t, m: torch.tanh(t)):
        got, want = fn(dx, dc), fn(x, c)
        assert got.stride() == want.stride()
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@pytest.mark.skipif(torch.mydev.device_count() < 2, reason="needs two mydev devices")
def test_where_and_item_on_a_second_device():
    a = torch.randn(3, 5000)
    c = a > 0
    for cols in (5, 5000):   # at the call, queued
        da, dc = a[:, :cols].to("mydev:1"), c[:, :cols].to("mydev:1")
        got = torch.where(dc, da, -da)
        assert got.device == torch.device("mydev:1")
        torch.testing.assert_close(got.cpu(), torch.where(c[:, :cols], a[:, :cols], -a[:, :cols]))
        assert got[1, 2].item() == torch.where(c, a, -a)[1, 2].item()
    kind, msg = _error(lambda: torch.where(dc, da, torch.zeros(3, 5000, device="mydev:0")))
    assert kind is RuntimeError and "mydev:1 and mydev:0" in msg, msg
    torch.testing.assert_close((da * 2).cpu(), a * 2)
