"""The functional comparisons eq, ne, lt, le, gt, ge (.Tensor and .Scalar overloads) on their own
structured kernels (csrc/native/TensorCompare.cpp) against the CPU: every dtype the kernels take,
broadcasting, 0-d and non-contiguous operands, at the call and queued, the numbers that keep the
tensor's dtype (converted as the CPU converts them) and those that promote (host kernel), NaN and
inf, errors, strict mode, and that none of the kernel's calls take the host kernel."""
import warnings

import pytest
import torch

import my_device

from conftest import delayed, host_kernel_calls

OPS = ["eq", "ne", "lt", "le", "gt", "ge"]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8,
          torch.bool]
# (4, 16) runs at the call; (80, 80) (6400 elements, over kShortKernelElements) is queued.
SHAPES = {"short": (4, 16), "queued": (80, 80)}


def _rand(shape, dtype, g):
    """Values with repeats (so that eq/le/ge see equal pairs) and, for floating dtypes, NaN, inf and -0.0."""
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(0, 6, shape, generator=g).to(dtype)
    t = (torch.randint(-3, 4, shape, generator=g) * 0.5).to(dtype)
    flat = t.view(-1)
    if flat.numel() >= 8:
        flat[:5] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0]).to(dtype)
    return t


def _same(got, want):
    assert got.device.type == "mydev" and got.dtype == want.dtype == torch.bool, (got, want)
    assert torch.equal(got.cpu(), want), (got.cpu(), want)


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e), str(e)
    return None


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensor_overload_matches_cpu_on_its_own_kernel(dtype, shape):
    g = torch.Generator().manual_seed(0)
    a, b = _rand(shape, dtype, g), _rand(shape, dtype, g)
    da, db = a.to("mydev"), b.to("mydev")
    for op in OPS:
        got, host_calls = host_kernel_calls(lambda: getattr(torch, op)(da, db))
        assert host_calls == 0, op
        _same(got, getattr(torch, op)(a, b))
    # The operator and method forms reach the same kernels.
    got, host_calls = host_kernel_calls(lambda: [da < db, da <= db, da > db, da >= db, da == db, da != db,
                                                 da.gt(db)])
    assert host_calls == 0
    for x, y in zip(got, [a < b, a <= b, a > b, a >= b, a == b, a != b, a.gt(b)]):
        _same(x, y)


# Numbers that keep each dtype (no promotion), chosen to hit equality, the dtype's rounding and its range.
KEEPING = {
    torch.float32: [0, 0.5, -1.5, 1e300, -1e300, float("nan"), float("inf"), -0.0, 16777217, True],
    torch.float64: [0, 0.5, -1.5, float("nan"), -float("inf"), 2 ** 62 + 1, False],
    # (1 + 2**-11 + 2**-40: rounded to float first, a tie, then to half, as the CPU's cast does)
    torch.float16: [0, 3.14, 1.5, 65520.0, 1e-8, float("nan"), 70000, 1 + 2 ** -11 + 2 ** -40, True],
    torch.bfloat16: [0, 3.14, -0.5, 1e39, float("inf"), 257, 1 + 2 ** -8 + 2 ** -40, False],
    torch.int32: [0, 3, -1, 2 ** 40 + 2, True],
    torch.int64: [0, 2, -(2 ** 63), 2 ** 63 - 1, False],
    torch.uint8: [0, 2, -1, 258, 1000, True],
    torch.bool: [True, False],
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_scalar_overload_matches_cpu_on_its_own_kernel(dtype, shape):
    g = torch.Generator().manual_seed(1)
    a = _rand(shape, dtype, g)
    if dtype.is_floating_point:
        a.view(-1)[5:8] = torch.tensor([3.14, 65520.0, 16777217.0]).to(dtype)
    da = a.to("mydev")
    for number in KEEPING[dtype]:
        for op in OPS:
            got, host_calls = host_kernel_calls(lambda: getattr(torch, op)(da, number))
            assert host_calls == 0, (op, number)
            _same(got, getattr(torch, op)(a, number))
    zero, one = (False, True) if dtype == torch.bool else (0, 1)   # (an int would promote bool to int64)
    got, host_calls = host_kernel_calls(lambda: [da > zero, zero < da, da.le(one), da == one, True != da])
    assert host_calls == 0
    for x, y in zip(got, [a > zero, zero < a, a.le(one), a == one, True != a]):
        _same(x, y)


@pytest.mark.parametrize("case", [
    (torch.int64, 0.5), (torch.int32, 2.5), (torch.uint8, -0.5), (torch.int64, float("nan")),
    (torch.int32, float("inf")), (torch.bool, 1), (torch.bool, 0.5), (torch.bool, -1), (torch.uint8, 1.0),
    (torch.int64, 1j), (torch.float32, 1 + 0j), (torch.int64, 2 ** 63), (torch.uint8, 2 ** 64 - 1),
    (torch.float32, 2 ** 63), (torch.bool, 2 ** 63),
], ids=str)
def test_numbers_that_promote_match_cpu(case):
    """int tensor vs 0.5 compares as float, bool vs int as int64: the host kernel's calls, as the CPU's."""
    dtype, number = case
    a = _rand((4, 7), dtype, torch.Generator().manual_seed(2))
    da = a.to("mydev")
    for op in (OPS if isinstance(number, (int, float)) else ["eq", "ne"]):
        want = _error(lambda: getattr(torch, op)(a, number))
        if want is None:
            _same(getattr(torch, op)(da, number), getattr(torch, op)(a, number))
        else:   # (bool vs 2**63: no promotion to uint64)
            assert _error(lambda: getattr(torch, op)(da, number)) == want
    if isinstance(number, complex):
        assert _error(lambda: da > number) == _error(lambda: a > number)
    _same(da > 0 if dtype != torch.bool else da > False, a > 0 if dtype != torch.bool else a > False)


@pytest.mark.parametrize("dtypes", [(torch.int64, torch.float32), (torch.float16, torch.float32),
                                    (torch.bool, torch.uint8), (torch.int32, torch.int64),
                                    (torch.bfloat16, torch.float16)], ids=str)
def test_mixed_dtypes_match_cpu(dtypes):
    g = torch.Generator().manual_seed(3)
    a, b = _rand((5, 6), dtypes[0], g), _rand((6,), dtypes[1], g)
    for op in OPS:
        _same(getattr(torch, op)(a.to("mydev"), b.to("mydev")), getattr(torch, op)(a, b))
        _same(getattr(torch, op)(b.to("mydev"), a.to("mydev")), getattr(torch, op)(b, a))


@pytest.mark.parametrize("shapes", [((4, 1), (1, 16)), ((), (3, 5)), ((3, 5), ()), ((), ()), ((2, 1, 5), (3, 1)),
                                    ((0, 4), (1, 4)), ((70, 1), (1, 70))], ids=str)
def test_broadcasting_and_0d_match_cpu(shapes):
    g = torch.Generator().manual_seed(4)
    a, b = _rand(shapes[0], torch.float32, g), _rand(shapes[1], torch.float32, g)
    for op in OPS:
        got, host_calls = host_kernel_calls(lambda: getattr(torch, op)(a.to("mydev"), b.to("mydev")))
        assert host_calls == 0
        _same(got, getattr(torch, op)(a, b))
        _same(getattr(torch, op)(a.to("mydev"), 0.5), getattr(torch, op)(a, 0.5))


def test_a_0d_cpu_tensor_beside_device_tensors_matches_cpu():
    a = _rand((4, 6), torch.float32, torch.Generator().manual_seed(5))
    for other in (torch.tensor(0.5), torch.tensor(1, dtype=torch.int64), torch.tensor(float("nan"))):
        for op in OPS:
            _same(getattr(torch, op)(a.to("mydev"), other), getattr(torch, op)(a, other))


@pytest.mark.parametrize("n", [16, 3000], ids=["short", "queued"])
def test_non_contiguous_operands_and_behind_queued_work(n):
    g = torch.Generator().manual_seed(6)
    a, b = _rand((n, 8), torch.float32, g), _rand((8, n), torch.float32, g)
    da, db = a.to("mydev"), b.to("mydev")
    s = torch.mydev.default_stream()
    with delayed(s, us=20_000):
        x = da * 2                      # queued, held back: the comparisons must wait for it
        got = [torch.gt(x.t(), db), torch.le(x.t()[:, ::2], db[:, 1::2]), torch.eq(x[::3], 0.0),
               x.t().ne(1.0), torch.lt(x.t(), db[0])]
        assert not s.query()
    want = [torch.gt((a * 2).t(), b), torch.le((a * 2).t()[:, ::2], b[:, 1::2]), torch.eq((a * 2)[::3], 0.0),
            (a * 2).t().ne(1.0), torch.lt((a * 2).t(), b[0])]
    for x, y in zip(got, want):
        _same(x, y)


def test_the_where_row_of_the_bench_takes_no_host_kernel():
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    da, db = a.to("mydev"), b.to("mydev")
    got, host_calls = host_kernel_calls(lambda: torch.where(da > 0, da, db))
    assert host_calls == 0
    assert torch.equal(got.cpu(), torch.where(a > 0, a, b))


def test_no_new_warnings():
    a = torch.tensor([0, 255], dtype=torch.uint8)
    for fn in (lambda t: t > -1, lambda t: t == 1000, lambda t: t < 0.5, lambda t: torch.ge(t, t)):
        with warnings.catch_warnings(record=True) as want:
            warnings.simplefilter("always")
            fn(a)
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            fn(a.to("mydev")).cpu()
        assert [str(w.message) for w in got] == [str(w.message) for w in want]


def test_errors_match_cpu_and_the_device_still_works():
    a, b = torch.randn(4), torch.randn(5)
    da, db = a.to("mydev"), b.to("mydev")
    for op in OPS:
        assert _error(lambda: getattr(torch, op)(da, db)) == _error(lambda: getattr(torch, op)(a, b))
        kind, msg = _error(lambda: getattr(torch, op)(da, torch.randn(4)))
        assert kind is RuntimeError and "Expected all tensors to be on the same device" in msg, msg
        assert "mydev:0" in msg and "cpu" in msg, msg
    # Dtypes the comparison loops lack raise as on the CPU, at the call.
    z = torch.tensor([1 + 1j, 2 - 1j])
    assert _error(lambda: z.to("mydev") > z.to("mydev")) == _error(lambda: z > z)
    _same(torch.eq(z.to("mydev"), z.to("mydev")), torch.eq(z, z))
    # out= (the host kernel's) still works beside the functional forms.
    got, want = torch.empty(0, device="mydev"), torch.empty(0)
    torch.gt(da, 0, out=got)
    torch.gt(a, 0, out=want)
    assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
    _same(torch.where(da > 0, da, -da) > 0.5, torch.where(a > 0, a, -a) > 0.5)
    assert (da + 1).sum().item() == pytest.approx((a + 1).sum().item(), rel=1e-6)


def test_comparisons_in_strict_mode(python_subprocess):
    # In strict mode a device address faults on any host read: the kernels
    # must reach their operands (and a converted number on the CPU) correctly.
    r = python_subprocess("""
        import torch, my_device
        g = torch.Generator().manual_seed(0)
        for shape in ((4, 16), (80, 80)):
            for dtype in (torch.float32, torch.int64, torch.float16, torch.bool):
                a = (torch.randint(-2, 3, shape, generator=g)).to(dtype)
                b = (torch.randint(-2, 3, shape[1:], generator=g)).to(dtype)
                da, db = a.to("mydev"), b.to("mydev")
                for op in ("eq", "ne", "lt", "le", "gt", "ge"):
                    f = getattr(torch, op)
                    assert torch.equal(f(da, db).cpu(), f(a, b)), (op, dtype)
                    assert torch.equal(f(da, 1).cpu(), f(a, 1)), (op, dtype)
                    assert torch.equal(f(da, 0.5).cpu(), f(a, 0.5)), (op, dtype)
                    assert torch.equal(f(da, torch.tensor(1).to(dtype)).cpu(), f(a, torch.tensor(1).to(dtype)))
        print("ok")
    """, env={"MYDEV_STRICT": "1"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
