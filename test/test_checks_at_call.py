"""Errors and warnings that do not depend on tensor data come at the call on mydev, as on the
CPU, even while the stream is busy; errors that depend on data (an index out of range) are
reported at the next synchronisation, and none is lost.

Every case runs first on the CPU for the expected outcome, then on mydev after a valid call of
the same op (a kernel's first call may run at the call while later ones are queued: the queued
path is the one checked), with the stream's worker held back so that whatever is launched stays
queued. Afterwards nothing is left to report and the device still computes like the CPU."""
import collections
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import my_device  # noqa: F401

from conftest import breakdown_counts, delayed

D = "mydev"
# How long the worker waits before each task: long enough that nothing launched in a check runs
# before the check ends, short enough to keep the file quick.
HOLD_US = 30_000


# ---------------------------------------------------------------------------------------------
# helpers

def stream():
    return torch.mydev.current_stream()


def hold_busy(s):
    """Queues a task behind the delay, so that `s` has pending work. (Twice: a process's first call
    of an op in a dtype runs at the call, in stream order.)"""
    torch.ones(4, device=D).add_(1)
    torch.ones(4, device=D).add_(1)
    assert not s.query(), "the stream should have work pending"


def first_line(x):
    text = str(x)
    text = text.split("(Triggered internally at")[0]
    return text.strip().splitlines()[0] if text.strip() else ""


def warned(caught):
    return [(w.category, first_line(w.message)) for w in caught]


def outcome(fn, *args):
    """fn(*args)'s (exception or None, [(category, message) it warned]), warnings always on."""
    warn_always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001
                return e, warned(caught)
        return None, warned(caught)
    finally:
        torch.set_warn_always(warn_always)


def device_still_works():
    torch.mydev.synchronize()                  # nothing left to report
    a = torch.linspace(-2, 2, 12).view(3, 4)
    d = a.to(D)
    torch.testing.assert_close((d * 2 + 1).softmax(-1).cpu(), (a * 2 + 1).softmax(-1))
    torch.testing.assert_close((d @ d.t()).sum(0).cpu(), (a @ a.t()).sum(0))


def check_raises_at_call_like_cpu(make, valid, bad, rounds=2):
    """bad(*make(device)) raises on the CPU; on mydev, after valid(*make(mydev)), it raises the
    same exception (type and first line) at the call, with queued work ahead of it on the delayed
    stream. (The call may wait for that work, as a call of a dtype signature the queued path has
    not seen runs at the call in stream order; it must not return and leave the error to the
    worker.) The inputs are made before the stream is held busy, as making them may wait for it."""
    want, _ = outcome(bad, *make("cpu"))
    assert want is not None, "the CPU raises nothing here"
    valid(*make(D))                            # the op's first call, with ordinary arguments
    torch.mydev.synchronize()
    s = stream()
    for _ in range(rounds):                    # (a second round: answered from any cache)
        with delayed(s, us=HOLD_US):
            valid(*make(D))
            args = make(D)
            hold_busy(s)
            got, _ = outcome(bad, *args)
            assert got is not None, f"no error at the call; the CPU raised {type(want).__name__}: {want}"
            assert type(got) is type(want), f"{type(got).__name__}: {got}  (CPU: {type(want).__name__}: {want})"
            assert first_line(got) == first_line(want)
    device_still_works()


def check_warns_at_call_like_cpu(make, valid, bad, rounds=3, as_often=True):
    """bad(*make(device)) warns on the CPU (or raises); on mydev, after valid(*make(mydev)), each
    of `rounds` calls warns the CPU's warnings (`as_often` as the CPU, or at least once each)
    inside the block, at the call, and raises the same exception if the CPU does; no warning is
    left for the synchronisation."""
    want, want_warnings = outcome(bad, *make("cpu"))
    assert want_warnings or want is not None, "the CPU neither warns nor raises here"
    valid(*make(D))
    torch.mydev.synchronize()
    s = stream()
    for i in range(rounds):
        with delayed(s, us=HOLD_US):
            valid(*make(D))
            args = make(D)
            hold_busy(s)
            got, got_warnings = outcome(bad, *args)
            assert type(got) is type(want), f"call {i + 1}: {got!r} (CPU: {want!r})"
            if want is not None:
                assert first_line(got) == first_line(want)
            if as_often:
                assert got_warnings == want_warnings, f"call {i + 1}"
            else:
                assert set(got_warnings) == set(want_warnings), f"call {i + 1}"
            with warnings.catch_warnings(record=True) as at_sync:
                warnings.simplefilter("always")
                s.synchronize()
            assert warned(at_sync) == [], f"call {i + 1}: warned again at the synchronisation"
    device_still_works()


def check_results_like_cpu(fn, rounds=2):
    """fn(device)'s result on mydev, launched on the delayed stream, has the CPU's dtype, shape,
    strides and values."""
    want = fn("cpu")
    s = stream()
    for _ in range(rounds):
        with delayed(s, us=HOLD_US):
            got = fn(D)
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
        assert got.stride() == want.stride(), (got.stride(), want.stride())
        torch.testing.assert_close(got.cpu(), want, equal_nan=True)
    device_still_works()


def expanded(d):
    """A tensor of 6 elements that share one memory location."""
    return torch.full((1,), 0.5, device=d).expand(6)


def deterministic(fn):
    def run(*args):
        was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            return fn(*args)
        finally:
            torch.use_deterministic_algorithms(was)
    return run


def setitem(t, index, value):
    t[index] = value


# ---------------------------------------------------------------------------------------------
# errors at the call

def tensors(*values, **kwargs):
    """A make(device) for the cases: each value a list or number made a tensor on the device (with
    `kwargs`), or a callable of the device that makes the tensor."""
    return lambda d: tuple(v(d) if callable(v) else torch.tensor(v, device=d, **kwargs) for v in values)


OVERLAPPED = lambda d: (expanded(d), torch.tensor([0, 2], device=d), torch.ones(2, device=d))  # noqa: E731
BOOL_MASK = [True, False, True, False]
U8_MASK = lambda d: torch.tensor(BOOL_MASK, device=d).to(torch.uint8)  # noqa: E731
POOL3D_INPUTS = lambda n: lambda d: (torch.randn(4, 2, 8, 8, 8, device=d), torch.rand(n, 2, 3, device=d))  # noqa: E731
POOL2D_INPUTS = lambda n: lambda d: (torch.randn(4, 2, 8, 8, device=d), torch.rand(n, 2, 2, device=d))  # noqa: E731

RAISES = [
    # (name, make the inputs, a valid call of the op, the call that raises on the CPU)
    ("index_add_ into an expansion", OVERLAPPED,
     lambda x, i, v: x.clone().index_add_(0, i, v), lambda x, i, v: x.index_add_(0, i, v)),
    ("scatter_ into an expansion", OVERLAPPED,
     lambda x, i, v: x.clone().scatter_(0, i, v), lambda x, i, v: x.scatter_(0, i, v)),
    ("put_ into an expansion", OVERLAPPED,
     lambda x, i, v: x.clone().put_(i, v), lambda x, i, v: x.put_(i, v)),
    ("index_copy_ into an expansion", OVERLAPPED,
     lambda x, i, v: x.clone().index_copy_(0, i, v), lambda x, i, v: x.index_copy_(0, i, v)),
    ("bernoulli_ into an expansion", OVERLAPPED,
     lambda x, i, v: x.clone().bernoulli_(), lambda x, i, v: x.bernoulli_()),
    ("index_fill_ of a complex number into a real tensor", tensors([0.0, 0.0, 0.0], [0, 2]),
     lambda x, i: x.index_fill_(0, i, 1.0), lambda x, i: x.index_fill_(0, i, 1j)),
    ("index_put_ into a 0-dim tensor", tensors(0.0, [0.0, 0.0], [0], [1.0]),
     lambda x0, x1, i, v: x1.index_put_((i,), v), lambda x0, x1, i, v: x0.index_put_((i,), v)),
    ("setitem with index lists that do not broadcast", tensors([[0.0] * 3] * 3),
     lambda t: setitem(t, ([0, 1], [0, 1]), 1.0), lambda t: setitem(t, ([0, 1], [0, 1, 2]), 1.0)),
    ("setitem with a boolean mask and a value of the wrong length", tensors([0.0] * 4, BOOL_MASK, [1.0] * 3),
     lambda t, m, v: setitem(t, m, v[:2]), lambda t, m, v: setitem(t, m, v)),
    ("setitem of a number with a uint8 mask", tensors([0.0] * 4, BOOL_MASK, U8_MASK),
     lambda t, m, m8: setitem(t, m, 2.0), lambda t, m, m8: setitem(t, m8, 2.0)),
    ("fractional_max_pool3d with fewer random samples than the batch", POOL3D_INPUTS(2),
     lambda x, r: F.fractional_max_pool3d(x, 2, output_size=4, _random_samples=r.repeat(2, 1, 1)),
     lambda x, r: F.fractional_max_pool3d(x, 2, output_size=4, _random_samples=r)),
    ("fractional_max_pool2d with fewer random samples than the batch", POOL2D_INPUTS(2),
     lambda x, r: F.fractional_max_pool2d(x, 2, output_size=4, _random_samples=r.repeat(2, 1, 1)),
     lambda x, r: F.fractional_max_pool2d(x, 2, output_size=4, _random_samples=r)),
    ("put_ under use_deterministic_algorithms", tensors([0.0] * 6, [0, 2], [1.0, 1.0]),
     lambda x, i, v: x.put_(i, v), deterministic(lambda x, i, v: x.put_(i, v))),
    ("random_ of float16 beyond its range", tensors([0.0] * 3, dtype=torch.float16),
     lambda x: x.random_(0, 10), lambda x: x.random_(0, 2 ** 20)),
    ("cat into an out= that overlaps an input", tensors([0.0, 1.0, 2.0, 3.0]),
     lambda a: torch.cat([a[:2], a[2:]], out=torch.empty_like(a)), lambda a: torch.cat([a[:2], a[2:]], out=a)),
    ("neg into an integer out=", tensors([0.0, 1.0, 2.0, 3.0], [0, 0, 0, 0], [0.0] * 4),
     lambda a, i, f: torch.neg(a, out=f), lambda a, i, f: torch.neg(a, out=i)),
    ("gelu with an unknown approximation", tensors([0.5, -0.5]),   # (from the OpInfo error_inputs below)
     lambda x: F.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="asdf")),
    # A dtype a structured kernel's loop lacks: its dispatch raises, at the call on the CPU.
    ("relu of bool", tensors([0.5, -0.5], [True, False]), lambda x, b: torch.relu(x), lambda x, b: torch.relu(b)),
    ("relu_ of uint16", lambda d: (torch.tensor([1.0], device=d), torch.tensor([1, 2], device=d).to(torch.uint16)),
     lambda x, u: torch.relu_(x), lambda x, u: torch.relu_(u)),
    ("silu of int8", lambda d: (torch.tensor([1.0], device=d), torch.tensor([1, 2], device=d).to(torch.int8)),
     lambda x, i: F.silu(x), lambda x, i: F.silu(i)),
    ("silu of a large bool tensor", lambda d: (torch.ones(8192, device=d), torch.ones(8192, device=d) > 0),
     lambda x, b: F.silu(x), lambda x, b: F.silu(b)),
    # Kernels outside TensorIterator (matrix products, softmax, losses) raise inside their loop for a
    # dtype or a mix of dtypes they lack: each dtype signature's first call runs at the call.
    ("bmm of float and int64", lambda d: (torch.ones(2, 3, 4, device=d), torch.ones(2, 4, 5, device=d),
                                          torch.ones(2, 4, 5, device=d, dtype=torch.long)),
     lambda a, b, i: torch.bmm(a, b), lambda a, b, i: torch.bmm(a, i)),
    ("mm of float and int64", lambda d: (torch.ones(3, 4, device=d), torch.ones(4, 5, device=d),
                                         torch.ones(4, 5, device=d, dtype=torch.long)),
     lambda a, b, i: torch.mm(a, b), lambda a, b, i: torch.mm(a, i)),
    ("scaled_dot_product_attention of int64", lambda d: (torch.ones(1, 2, 3, 4, device=d),
                                                         torch.ones(1, 2, 3, 4, device=d, dtype=torch.long)),
     lambda x, i: F.scaled_dot_product_attention(x, x, x), lambda x, i: F.scaled_dot_product_attention(i, i, i)),
    ("dropout of int64 in training", tensors([[1.0, 2.0]] * 64, [[1, 2]] * 64),
     lambda x, i: F.dropout(x, 0.5), lambda x, i: F.dropout(i, 0.5)),
    # The CPU's max_pool1d has a path of its own for floating types; other devices reach
    # max_pool2d_with_indices, whose CPU kernel (the one mydev runs) takes integers too.
    ("max_pool1d of int64", tensors([[[1.0, 2.0, 3.0, 4.0]]], [[[1, 2, 3, 4]]]),
     lambda x, i: F.max_pool1d(x, 2), lambda x, i: F.max_pool1d(i, 2)),
]


@pytest.mark.parametrize("name,make,valid,bad", RAISES, ids=[c[0] for c in RAISES])
def test_errors_come_at_the_call_like_cpu(name, make, valid, bad):
    check_raises_at_call_like_cpu(make, valid, bad)


# ---------------------------------------------------------------------------------------------
# warnings at the call

WARNS = [
    # (name, make the inputs, a valid call of the op, the call that warns on the CPU)
    ("masked_fill_ into an expansion", lambda d: (expanded(d), torch.tensor([True, False] * 3, device=d)),
     lambda x, m: x.clone().masked_fill_(m, 1.0), lambda x, m: x.masked_fill_(m, 1.0)),
    ("setitem of a tensor with a uint8 mask", tensors([0.0] * 4, BOOL_MASK, U8_MASK, [1.0, 2.0]),
     lambda t, m, m8, v: setitem(t, m, v), lambda t, m, m8, v: setitem(t, m8, v)),
]


def random_beyond_exact_integers(dtype, to):
    """(make, valid, bad) for random_ of `dtype` with an upper bound past its exact integers."""
    return tensors([0.0] * 3, dtype=dtype), lambda x: x.random_(0, 10), lambda x: x.random_(0, to)


RANDOM_WARNS = [  # (dtype, a bound CPU warns about)
    (torch.float32, 2 ** 30), (torch.bfloat16, 2 ** 20), (torch.float16, 2 ** 12), (torch.float64, 2 ** 60),
]


@pytest.mark.parametrize("name,make,valid,bad", WARNS, ids=[c[0] for c in WARNS])
def test_warnings_come_at_the_call_like_cpu(name, make, valid, bad):
    check_warns_at_call_like_cpu(make, valid, bad)


@pytest.mark.parametrize("dtype,to", RANDOM_WARNS, ids=[str(c[0]) for c in RANDOM_WARNS])
def test_random_bound_warnings_come_at_every_call(dtype, to):
    check_warns_at_call_like_cpu(*random_beyond_exact_integers(dtype, to), as_often=False)


@pytest.mark.parametrize("dtype,to", RANDOM_WARNS, ids=[str(c[0]) for c in RANDOM_WARNS])
def test_random_bound_warnings_come_once_per_call(dtype, to):
    check_warns_at_call_like_cpu(*random_beyond_exact_integers(dtype, to + 3))  # (a bound not used before)


def test_a_call_that_raised_at_the_call_leaves_nothing_to_confirm():
    # The pending confirmation of a call whose run at the call raised must die with it: the next new
    # signature (of any op) once confirmed the failed one, which was then queued and failed on the
    # worker, or was checked against it and refused, so that its op was never queued again.
    x = torch.zeros(5, dtype=torch.long, device=D)
    a = torch.ones(3, device=D)
    for other in (lambda: torch.neg(x), lambda: torch.cos(a), lambda: torch.count_nonzero(x, 0)):
        with pytest.raises(RuntimeError, match="not implemented for 'Long'"):
            x.normal_()
        other()                                # a new signature of another op, run at the call
        with pytest.raises(RuntimeError, match="not implemented for 'Long'"):
            x.normal_()                        # still raises at the call
        torch.mydev.synchronize()              # and nothing was left for the worker
    _, counts = breakdown_counts(lambda: [torch.cos(a) for _ in range(3)])
    assert counts.get("queued", 0) >= 2, counts  # cos still queues once confirmed


def test_a_put_queued_before_deterministic_mode_is_turned_on_runs_as_launched():
    x, i, v = torch.zeros(6, device=D), torch.tensor([0, 2], device=D), torch.ones(2, device=D)
    x.put_(i, v)                                # (the first call of a signature runs at the call)
    torch.mydev.synchronize()
    s = stream()
    for _ in range(2):
        with delayed(s, us=HOLD_US):
            x.put_(i, v)                        # launched without the setting: no alert
            assert not s.query()
            torch.use_deterministic_algorithms(True)
            try:
                s.synchronize()
            finally:
                torch.use_deterministic_algorithms(False)
    torch.testing.assert_close(x.cpu(), torch.zeros(6).put_(torch.tensor([0, 2]), torch.ones(2)))
    device_still_works()


# ---------------------------------------------------------------------------------------------
# out= on another device

def test_an_out_on_the_cpu_raises_at_the_call():
    a, b = torch.randn(3, device=D), torch.randn(3, device=D)
    torch.add(a, b, out=torch.empty(3, device=D))          # a valid call first
    s = stream()
    for _ in range(2):
        with delayed(s, us=HOLD_US):
            torch.add(a, b, out=torch.empty(3, device=D))
            hold_busy(s)
            with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
                torch.add(a, b, out=torch.empty((), device="cpu"))
            with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
                torch.add(a, b, out=torch.empty(3, device="cpu"))
            assert not s.query()
    device_still_works()


def test_an_inplace_op_on_a_cpu_tensor_with_a_device_operand_raises_at_the_call():
    # As on CUDA: a CPU 0-dim tensor may be an input of a device kernel, never its output.
    one = torch.ones((), device=D)
    torch.zeros((), device=D).atan2_(torch.ones((), device="cpu"))    # valid: a CPU scalar operand
    s = stream()
    for _ in range(2):
        with delayed(s, us=HOLD_US):
            torch.zeros((), device=D).atan2_(one)
            hold_busy(s)
            cpu_self = torch.zeros(())
            with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
                cpu_self.atan2_(one)
            assert not s.query()
            assert cpu_self.item() == 0.0                   # not written
    device_still_works()


# ---------------------------------------------------------------------------------------------
# results that depend on more than the arguments' dtypes and shapes


def test_a_cpu_boolean_mask_with_another_count_of_trues():
    zc = torch.arange(12.0).view(3, 4)
    m1 = torch.zeros(3, 4, dtype=torch.bool)
    m1[0, 1] = m1[2, 3] = True
    m2 = torch.zeros(3, 4, dtype=torch.bool)
    m2[1] = True
    m2[0, 0] = True

    def put(z, m):
        z = z.clone()
        z[m] = 1
        return z

    for fn in (lambda d: zc.to(d)[m1], lambda d: zc.to(d)[m2],
               lambda d: put(zc.to(d), m1), lambda d: put(zc.to(d), m2),
               lambda d: zc.to(d).index_put_((m2,), torch.tensor(5.0)),
               lambda d: zc.to(d)[m1]):
        check_results_like_cpu(fn)


def test_max_pool3d_of_an_unbatched_channels_last_like_input_after_batched_calls():
    batched = torch.randn(2, 4, 4, 4, 3).permute(0, 4, 1, 2, 3)     # channels_last_3d
    unbatched = torch.randn(4, 4, 4, 3).permute(3, 0, 1, 2)         # the same strides without the batch
    for x in (batched, batched, unbatched, batched, unbatched):
        check_results_like_cpu(lambda d: F.max_pool3d(x.to(d), 2), rounds=1)


def test_max_unpool2d_of_a_channels_last_input():
    x = torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last)
    pooled, indices = F.max_pool2d(x, 2, return_indices=True)
    for _ in range(2):
        check_results_like_cpu(lambda d: F.max_unpool2d(pooled.to(d), indices.to(d), 2))
        check_results_like_cpu(lambda d: F.max_unpool2d(pooled.to(d), indices.to(d), 2, output_size=(5, 5)))


@pytest.mark.parametrize("name,fn", [
    ("bool / bool", lambda d: torch.tensor([True, True, False], device=d) / torch.tensor([True, True, True], device=d)),
    ("int / float number", lambda d: torch.tensor([1, 2, 3], device=d) / 2.0),
    ("int / int", lambda d: torch.tensor([1, 2, 3], device=d) / torch.tensor([2, 2, 2], device=d)),
    ("true_divide of ints", lambda d: torch.true_divide(torch.tensor([1, 2, 3], device=d), 4)),
    ("sqrt of ints", lambda d: torch.sqrt(torch.tensor([1, 4, 9], device=d))),
])
def test_results_follow_the_default_dtype_like_cpu(name, fn):
    check_results_like_cpu(fn)                              # float32, the default: cached first
    was = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert fn("cpu").dtype == torch.float64
        check_results_like_cpu(fn)
    finally:
        torch.set_default_dtype(was)
    check_results_like_cpu(fn)                              # and back


# ---------------------------------------------------------------------------------------------
# errors that depend on the data: at the next synchronisation


DATA_ERRORS = [
    # (name, a valid call, the call with an index out of range, CPU's message)
    ("nll_loss target", lambda x: F.nll_loss(x, torch.tensor([0, 1], device=x.device)),
     lambda x: F.nll_loss(x, torch.tensor([0, 7], device=x.device)), "Target 7 is out of bounds"),
    ("indexing", lambda x: x[torch.tensor([1], device=x.device)],
     lambda x: x[torch.tensor([5], device=x.device)], "index 5 is out of bounds for dimension 0 with size 2"),
    ("gather", lambda x: x.gather(1, torch.tensor([[1], [0]], device=x.device)),
     lambda x: x.gather(1, torch.tensor([[1], [8]], device=x.device)),
     "index 8 is out of bounds for dimension 1 with size 5"),
]


@pytest.mark.parametrize("name,valid,bad,message", DATA_ERRORS, ids=[c[0] for c in DATA_ERRORS])
def test_a_data_error_is_reported_at_the_next_synchronisation(name, valid, bad, message):
    xc = torch.randn(2, 5)
    want, _ = outcome(bad, xc)
    assert want is not None and message in str(want)
    x = xc.to(D)
    valid(x)
    torch.mydev.synchronize()
    s = stream()
    with delayed(s, us=HOLD_US):
        valid(x)
        bad(x)                                              # not known at the call
        assert not s.query()
        with pytest.raises(type(want), match=message):      # the CPU's error type
            torch.mydev.synchronize()
        torch.mydev.synchronize()                           # reported once
    torch.testing.assert_close(valid(x).cpu(), valid(xc))
    device_still_works()


def test_a_second_data_error_is_reported_at_the_next_synchronisation_too():
    xc = torch.randn(2, 5)
    first, _ = outcome(lambda: F.nll_loss(xc, torch.tensor([0, 7])))
    second, _ = outcome(lambda: F.nll_loss(xc, torch.tensor([9, 0])))
    x = xc.to(D)
    F.nll_loss(x, torch.tensor([0, 1], device=D))
    torch.mydev.synchronize()
    s = stream()
    with delayed(s, us=HOLD_US):
        F.nll_loss(x, torch.tensor([0, 7], device=D))
        F.nll_loss(x, torch.tensor([9, 0], device=D))
        assert not s.query()
        with pytest.raises(type(first), match="Target 7 is out of bounds"):    # each by one synchronisation,
            torch.mydev.synchronize()
        with pytest.raises(type(second), match="Target 9 is out of bounds"):   # in order
            torch.mydev.synchronize()
        torch.mydev.synchronize()
    torch.testing.assert_close(F.nll_loss(x, torch.tensor([0, 1], device=D)).cpu(),
                               F.nll_loss(xc, torch.tensor([0, 1])))
    device_still_works()


# ---------------------------------------------------------------------------------------------
# every OpInfo's error_inputs

ERROR_INPUT_DELAY_US = 20_000   # holds the stream busy for each op's calls; short, for CI's run time


def _ops_with_error_inputs():
    from torch.testing._internal.common_methods_invocations import op_db
    return [op for op in op_db if op.error_inputs_func is not None]


def _op_label(op):
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _call(op, sample):
    return op(sample.input, *sample.args, **sample.kwargs)


def _run_a_valid_sample(op):
    """Runs op's first float32 sample input on mydev (or of the first dtype it has): the op's
    kernels have then seen a valid call. Returns a note if it failed."""
    dtypes = op.supported_dtypes("cpu")
    dtype = torch.float32 if torch.float32 in dtypes else min(dtypes, key=str, default=None)
    if dtype is None:
        return "no dtype"
    try:
        torch.manual_seed(0)
        sample = next(iter(op.sample_inputs_func(op, D, dtype, False)), None)
        if sample is not None:
            err, _ = outcome(lambda: _call(op, sample))
            torch.mydev.synchronize()
            if err is not None:
                return f"the valid sample raised {type(err).__name__}: {first_line(err)[:120]}"
    except Exception as e:  # noqa: BLE001
        return f"the valid sample failed: {type(e).__name__}: {first_line(e)[:120]}"
    return None


def _leaves(x):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    elif isinstance(x, dict):
        for k, v in sorted(x.items()):
            yield k
            yield from _leaves(v)
    else:
        yield x


def _sample_leaves(sample):
    return list(_leaves([sample.input, sample.args, sample.kwargs]))


def _describe(sample):
    """A short description of a sample, from metadata only (a repr would read the device tensors)."""
    def one(v):
        if isinstance(v, torch.Tensor):
            return f"T{list(v.shape)}:{str(v.dtype).replace('torch.', '')}" + (":cpu" if v.device.type == "cpu" else "")
        if isinstance(v, (list, tuple)):
            inner = ", ".join(one(x) for x in v)
            return f"[{inner}]" if isinstance(v, list) else f"({inner})"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}={one(x)}" for k, x in v.items()) + "}"
        return repr(v)
    text = one(sample.input)
    if sample.args:
        text += ", " + ", ".join(one(a) for a in sample.args)
    if sample.kwargs:
        text += ", " + ", ".join(f"{k}={one(v)}" for k, v in sample.kwargs.items())
    return text[:160]


def _signature(ei):
    """What must agree for a CPU ErrorInput to stand for a mydev one: the error expected, and the
    sample's structure, non-tensor values and tensors' metadata, with the device names left out."""
    def leaf(v):
        if isinstance(v, torch.Tensor):
            return ("tensor", tuple(v.shape), v.dtype, v.stride() if v.layout == torch.strided else None,
                    v.requires_grad)
        if isinstance(v, (torch.device, str)) and str(v).split(":")[0] in ("cpu", "mydev"):
            return "device"
        return repr(v)
    return (ei.error_type, ei.error_regex, tuple(leaf(v) for v in _sample_leaves(ei.sample_input)))


def _to_cpu(sample):
    """The sample with its mydev tensors copied to the CPU (keeping requires_grad, and one copy
    per tensor object, so that an argument passed twice stays one tensor)."""
    copies = {}

    def copy(t):
        if id(t) not in copies:
            c = t.detach().cpu()
            copies[id(t)] = c.requires_grad_(t.requires_grad) if c.is_floating_point() or c.is_complex() else c
        return copies[id(t)]
    return sample.transform(lambda t: copy(t) if isinstance(t, torch.Tensor) and t.device.type == D else t)


def _cpu_counterparts(op):
    """[(mydev ErrorInput, the same call on the CPU as a SampleInput, or None when it mixes devices)]:
    the CPU's ErrorInput of the same signature where there is one (made by the same code, so with
    the same aliasing), else the mydev sample copied to the CPU."""
    # (error_inputs_func itself: OpInfo.error_inputs' tracking inspects the stack at every item, which
    # under pytest costs more than the rest of this test)
    torch.manual_seed(0)
    cpu_inputs = list(op.error_inputs_func(op, "cpu"))
    torch.manual_seed(0)
    dev_inputs = list(op.error_inputs_func(op, D))
    unused = {}
    for ei in cpu_inputs:
        unused.setdefault(_signature(ei), []).append(ei)
    pairs = []
    for ei in dev_inputs:
        same = unused.get(_signature(ei))
        if same:
            pairs.append((ei, same.pop(0).sample_input))
            continue
        devices = {v.device.type for v in _sample_leaves(ei.sample_input) if isinstance(v, torch.Tensor)}
        pairs.append((ei, None if devices - {D} else _to_cpu(ei.sample_input)))
    return pairs


def _expected_error(op, ei, cpu_sample):
    """(type, regex or None, description) of the error ei must raise on mydev, or None if the
    CPU raises nothing for it (a device-specific input)."""
    if cpu_sample is None:                             # mixes devices: the OpInfo's word
        return ei.error_type, ei.error_regex, f"{ei.error_type.__name__}: /{ei.error_regex}/ (mixes devices)"
    want, _ = outcome(lambda: _call(op, cpu_sample))
    if want is None:
        return None
    regex = ei.error_regex if re.search(ei.error_regex, str(want)) else None
    return type(want), regex, f"{type(want).__name__}: {first_line(want)[:100]}"


def _what_mydev_did(op, ei, want_type, regex, s):
    """None if ei raised at the call with the expected type (and regex), or the error the OpInfo
    declares for this device (where it differs from the CPU's, as narrow_copy's), else what happened."""
    if s.query():
        hold_busy(s)                                   # work queued ahead of the call
    got, _ = outcome(lambda: _call(op, ei.sample_input))
    if got is None:
        try:
            s.synchronize()
        except Exception as e:  # noqa: BLE001
            return f"no error at the call; raised at sync: {type(e).__name__}: {first_line(e)[:120]}"
        return "no error (neither at the call nor at the synchronisation)"
    if "a kernel failed on mydev" in str(got):
        return f"raised at sync (a queued kernel's error, inside the call): {first_line(got)[:120]}"
    if type(got) is ei.error_type and re.search(ei.error_regex, str(got)):
        return None                                    # what the OpInfo says a non-CPU device raises (CUDA's)
    if type(got) is not want_type:
        return f"different type: {type(got).__name__}: {first_line(got)[:120]}"
    if regex is not None and not re.search(regex, str(got)):
        return f"message does not match {regex!r}: {type(got).__name__}: {first_line(got)[:120]}"
    return None


def error_input_mismatches(op, counts, rounds=2):
    """[(op, error input, the expected error, what mydev did)] for op's error_inputs on mydev that
    raise on the CPU (or, for an input that mixes devices, that the OpInfo says raise) but that
    mydev does not raise at the call with the same type (and the OpInfo's regex, where the CPU's
    message matches it), in any of `rounds` calls."""
    label = _op_label(op)
    note = _run_a_valid_sample(op)
    if note:
        counts["valid sample failed"] += 1
    try:
        pairs = _cpu_counterparts(op)
    except Exception as e:  # noqa: BLE001
        return [(label, "-", "-", f"error_inputs(mydev) failed: {type(e).__name__}: {first_line(e)[:120]}")]
    torch.mydev.synchronize()
    found = []
    s = stream()
    with delayed(s, us=ERROR_INPUT_DELAY_US):
        for n, (ei, cpu_sample) in enumerate(pairs):
            expected = _expected_error(op, ei, cpu_sample)
            if expected is None:
                counts["skipped: no error on the CPU"] += 1
                continue
            counts["checked"] += 1
            counts["mixing devices"] += cpu_sample is None
            for r in range(rounds):
                seen = _what_mydev_did(op, ei, expected[0], expected[1], s)
                if seen is not None:
                    found.append((label, f"#{n} {_describe(ei.sample_input)}", expected[2],
                                  f"call {r + 1}: {seen}" + (f"  [{note}]" if note else "")))
                    break
    torch.mydev.synchronize()
    return found


def test_opinfo_error_inputs_raise_at_the_call_like_cpu():
    # Every OpInfo of op_db that has error_inputs (226 ops, about 680 inputs the CPU raises on,
    # each called twice on mydev after one valid float32 sample of the op): about 15 s.
    counts = collections.Counter()
    mismatches = []
    for op in _ops_with_error_inputs():
        mismatches += error_input_mismatches(op, counts)
        counts["ops"] += 1
    device_still_works()
    print(f"\nerror_inputs: {dict(counts)}; {len(mismatches)} mismatches")
    for m in mismatches:
        print("  " + " | ".join(m))
    assert not mismatches, "\n".join(" | ".join(m) for m in mismatches)
