"""The foreach ops on mydev against the CPU: PyTorch's foreach OpInfos, the optimizers' calls, their errors.

The ops torch.optim's foreach SGD, Adam and AdamW call have kernels of their
own (csrc/native/ForeachOps.cpp): one queued kernel per call, running the
CPU's per-tensor structured kernels. Calls those kernels do not take (mixed
dtypes, integer or complex operands, bad lists) go where every other
in-place foreach op goes: one queued host kernel per call
(csrc/native/hostkernel/Plan.h, Kind::InPlaceList), which runs the CPU's
composite kernel; an out-of-place one to PyTorch's per-tensor composite.
These check that the results and the errors are the CPU's either way, and
which path a call took.
"""
import re

import pytest
import torch
from torch.testing._internal import common_methods_invocations as cmi

import my_device

DBS = ("foreach_unary_op_db", "foreach_binary_op_db", "foreach_pointwise_op_db", "foreach_other_op_db")
ALL_OPS = [op for name in DBS for op in getattr(cmi, name)]
IN_PLACE = [op for op in ALL_OPS if op.inplace_variant is not None]
# The ops ForeachOps.cpp serves (every sample of theirs is swept, in both variants).
OWN = {"_foreach_add", "_foreach_sub", "_foreach_mul", "_foreach_div", "_foreach_maximum", "_foreach_lerp",
       "_foreach_addcmul", "_foreach_addcdiv", "_foreach_sqrt", "_foreach_neg"}
OWN_OPS = [op for op in ALL_OPS if op.name in OWN]


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.detach().to(device, copy=True)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(e, device) for e in x)
    return x


def _samples(op, dtype, limit=3):
    # Samples of 3 tensors each (lists of different shapes included).
    samples = list(op.sample_inputs("cpu", dtype, num_input_tensors=[3]))
    return samples if op.name in OWN else samples[:limit]


def _sweep(op, variant, dtype):
    samples = _samples(op, dtype)
    assert samples, op.name
    for sample in samples:
        cpu_in = _to(sample.input, "cpu")
        cpu_args, kwargs = _to(sample.args, "cpu"), sample.kwargs
        try:
            cpu_out = variant(cpu_in, *cpu_args, **kwargs)
        except (RuntimeError, ValueError, TypeError) as e:
            # The CPU rejects this sample: mydev must reject it the same way, at the call.
            dev_in = _to(sample.input, "mydev")
            with pytest.raises(type(e)):
                variant(dev_in, *_to(sample.args, "mydev"), **kwargs)
            torch.mydev.synchronize()
            continue
        dev_in = _to(sample.input, "mydev")
        dev_out = variant(dev_in, *_to(sample.args, "mydev"), **kwargs)
        got, want = (dev_in, cpu_in) if cpu_out is None else (dev_out, cpu_out)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.device.type == "mydev"
            torch.testing.assert_close(g.cpu(), w, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("op", IN_PLACE, ids=[op.name for op in IN_PLACE])
def test_in_place_foreach_op_like_cpu(op, dtype):
    _sweep(op, op.inplace_variant, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("op", OWN_OPS, ids=[op.name for op in OWN_OPS])
def test_out_of_place_foreach_op_like_cpu(op, dtype):
    _sweep(op, op.op, dtype)


# -- which path a call takes ----------------------------------------------------------------------

def _lists(device, dtype=torch.float32, shapes=((16, 16),) * 4, seed=0, positive=False):
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(s, generator=g, dtype=dtype) for s in shapes]
    if positive:
        out = [t.abs() + 0.5 for t in out]
    return [t.to(device) for t in out]


def _operands(device, dtype=torch.float32, shapes=((16, 16),) * 4):
    return (_lists(device, dtype, shapes, 0), _lists(device, dtype, shapes, 1), _lists(device, dtype, shapes, 2),
            _lists(device, dtype, shapes, 3, positive=True), torch.tensor(0.75, dtype=dtype, device=device))


# Every overload ForeachOps.cpp registers, called as an optimizer calls it:
# (a, b, c, d) are four lists, d positive, s a 0-dim tensor.
CALLS = {
    "_foreach_add_.List": lambda a, b, c, d, s: torch._foreach_add_(a, b, alpha=-0.1),
    "_foreach_add_.Scalar": lambda a, b, c, d, s: torch._foreach_add_(a, 1e-8),
    "_foreach_add_.ScalarList": lambda a, b, c, d, s: torch._foreach_add_(a, [0.5, -1, 2.5, 3]),
    "_foreach_sub_.List": lambda a, b, c, d, s: torch._foreach_sub_(a, b, alpha=2),
    "_foreach_sub_.Scalar": lambda a, b, c, d, s: torch._foreach_sub_(a, 0.25),
    "_foreach_mul_.List": lambda a, b, c, d, s: torch._foreach_mul_(a, b),
    "_foreach_mul_.Scalar": lambda a, b, c, d, s: torch._foreach_mul_(a, 0.9),
    "_foreach_mul_.ScalarList": lambda a, b, c, d, s: torch._foreach_mul_(a, [0.1, 2, -3.5, 1e38]),
    "_foreach_mul_.Tensor": lambda a, b, c, d, s: torch._foreach_mul_(a, s),
    "_foreach_div_.List": lambda a, b, c, d, s: torch._foreach_div_(a, d),
    "_foreach_div_.Scalar": lambda a, b, c, d, s: torch._foreach_div_(a, 3),
    "_foreach_div_.ScalarList": lambda a, b, c, d, s: torch._foreach_div_(a, [0.9, 0.99, 1e-300, 1e300]),
    "_foreach_maximum_.List": lambda a, b, c, d, s: torch._foreach_maximum_(a, b),
    "_foreach_lerp_.Scalar": lambda a, b, c, d, s: torch._foreach_lerp_(a, b, 0.1),
    "_foreach_lerp_.List": lambda a, b, c, d, s: torch._foreach_lerp_(a, b, c),
    "_foreach_addcmul_.Scalar": lambda a, b, c, d, s: torch._foreach_addcmul_(a, b, c, value=0.001),
    "_foreach_addcmul_.ScalarList": lambda a, b, c, d, s: torch._foreach_addcmul_(a, b, c, [1, 2.0, -0.5, 0.25]),
    "_foreach_addcdiv_.Scalar": lambda a, b, c, d, s: torch._foreach_addcdiv_(a, b, d, value=-0.01),
    "_foreach_addcdiv_.ScalarList": lambda a, b, c, d, s: torch._foreach_addcdiv_(a, b, d, [-0.1, -0.2, 0.3, 4]),
    "_foreach_sqrt_": lambda a, b, c, d, s: torch._foreach_sqrt_(d),
    "_foreach_neg_": lambda a, b, c, d, s: torch._foreach_neg_(a),
    "_foreach_add.List": lambda a, b, c, d, s: torch._foreach_add(a, b, alpha=0.5),
    "_foreach_add.Scalar": lambda a, b, c, d, s: torch._foreach_add(a, 2),
    "_foreach_sub.Scalar": lambda a, b, c, d, s: torch._foreach_sub(a, 1e-3),
    "_foreach_sub.List": lambda a, b, c, d, s: torch._foreach_sub(a, b),
    "_foreach_mul.List": lambda a, b, c, d, s: torch._foreach_mul(a, b),
    "_foreach_mul.Scalar": lambda a, b, c, d, s: torch._foreach_mul(a, -1.5),
    "_foreach_div.List": lambda a, b, c, d, s: torch._foreach_div(a, d),
    "_foreach_div.Scalar": lambda a, b, c, d, s: torch._foreach_div(a, 7.0),
    "_foreach_maximum.List": lambda a, b, c, d, s: torch._foreach_maximum(a, b),
    "_foreach_sqrt": lambda a, b, c, d, s: torch._foreach_sqrt(d),
    "_foreach_neg": lambda a, b, c, d, s: torch._foreach_neg(a),
}


def test_every_registered_overload_is_called():
    # The table above names every overload ForeachOps.cpp registers (and no other).
    own = {name for name in CALLS
           if "ForeachOps.cpp" in torch._C._dispatch_dump(f"aten::{name}")}
    assert own == set(CALLS)


def _run_and_trace(fn, *args):
    """Runs fn(*args) on mydev; returns its result, the aten ops the profiler saw and the host-kernel calls."""
    torch.mydev.synchronize()
    my_device._C._host_kernel_breakdown(True)
    try:
        with torch.autograd.profiler.profile() as prof:
            out = fn(*args)
        torch.mydev.synchronize()
    finally:
        counts = dict(my_device._C._host_kernel_breakdown(False))
    names = {e.name for e in prof.function_events if e.name.startswith("aten::")}
    return out, names, counts["queued"] + counts["inline"]


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.device.type == "mydev" and g.dtype == w.dtype and g.shape == w.shape
        # The same CPU kernels on the same values: bit for bit.
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, equal_nan=True)


SHAPES = {
    "small": ((16, 16),) * 4,
    "mixed_shapes": ((16, 16), (16,), (3, 5, 2), ()),
    # Over the short-kernel limit (kShortKernelElements): handed to the stream's worker;
    # 80 KB tensors are leased, not held, by the queued kernel (KernelArgs.h).
    "large": ((128, 160), (64, 64), (100,), (1,)),
}


@pytest.mark.parametrize("shapes", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", CALLS.keys())
def test_fast_path_is_one_kernel_with_cpu_results(name, dtype, shapes):
    fn = CALLS[name]
    cpu = _operands("cpu", dtype, shapes)
    dev = _operands("mydev", dtype, shapes)
    want = fn(*cpu)
    got, ops, host_kernel_calls = _run_and_trace(fn, *dev)
    # No per-tensor op (aten::add_, aten::sqrt, ...) and no host kernel: the
    # call went straight to ForeachOps.cpp's kernel.
    assert ops == {f"aten::{name.split('.')[0]}"}, ops
    assert host_kernel_calls == 0
    if want is None:  # in place: every list the CPU call wrote
        for g, w in zip(dev[:4], cpu[:4]):
            _assert_same(g, w)
    else:
        _assert_same(got, want)


FALLBACKS = {
    # `other` of another dtype: the CPU promotes per tensor
    "mixed_dtypes_in_place": (lambda a, b: torch._foreach_add_(a, [t.double() for t in b]), "aten::add_"),
    # a complex number on float lists
    "complex_number_in_place": (lambda a, b: torch._foreach_add_([t.to(torch.complex64) for t in a], 1 + 2j),
                                "aten::add_"),
    # integer lists
    "integer_lists_in_place": (lambda a, b: torch._foreach_addcmul_([t.long() for t in a], [t.long() for t in b],
                                                                    [t.long() for t in b]), "aten::addcmul_"),
    # half (its loops read numbers unrounded)
    "half_out_of_place": (lambda a, b: torch._foreach_add([t.half() for t in a], 0.1), "aten::add"),
    "mixed_dtypes_out_of_place": (lambda a, b: torch._foreach_mul(a, [t.double() for t in b]), "aten::mul"),
}


@pytest.mark.parametrize("name", FALLBACKS.keys())
def test_calls_the_fast_path_cannot_serve_take_the_former_paths(name):
    fn, per_tensor_op = FALLBACKS[name]
    cpu, dev = _operands("cpu")[:2], _operands("mydev")[:2]
    want = fn(*cpu)
    got, ops, host_kernel_calls = _run_and_trace(fn, *dev)
    # The composite's per-tensor ops ran: on host aliases inside the host kernel
    # (in place), or each as a mydev op (out of place).
    assert per_tensor_op in ops, ops
    if want is None:
        assert host_kernel_calls == 1
        for g, w in zip(dev, cpu):
            _assert_same(g, w)
    else:
        _assert_same(got, want)


@pytest.mark.parametrize("shape", [(4, 8), (128, 160), (512, 600)], ids=["small", "leased", "two blocks"])
def test_lists_whose_tensors_alias_run_in_list_order_like_cpu(shape):
    # ("two blocks": lists big enough to run in two blocks of entries on the compute units, which entries that
    # share memory must not)
    def calls(x, y):
        torch._foreach_mul_([x, x, y], [2.0, 3.0, 0.5])
        torch._foreach_add_([x, y], [y, x])  # y += the x just written
        torch._foreach_lerp_([x[0], x[1]], [x[1], x[0]], 0.25)  # rows of one tensor
        return torch._foreach_add([x, x], [x, y], alpha=2)

    cpu = _lists("cpu", shapes=(shape,) * 2)
    dev = _lists("mydev", shapes=(shape,) * 2)
    want = calls(*cpu)
    got, ops, host_kernel_calls = _run_and_trace(calls, *dev)
    assert host_kernel_calls == 0
    _assert_same(dev, cpu)
    _assert_same(got, want)


def test_non_contiguous_and_broadcast_operands_like_cpu():
    def calls(a, b, row):
        torch._foreach_add_([a[0].t(), a[1][:, ::2]], [b[0], b[1][:, 1::2]], alpha=0.5)
        torch._foreach_mul_([a[2], a[3]], [row, row])  # (16,) broadcast over (16, 16)
        return torch._foreach_sqrt([t.t() for t in b[2:]])

    cpu_a, cpu_b, dev_a, dev_b = _lists("cpu"), _lists("cpu", seed=1, positive=True), _lists("mydev"), \
        _lists("mydev", seed=1, positive=True)
    want = calls(cpu_a, cpu_b, cpu_a[0][0].clone())
    got, _, host_kernel_calls = _run_and_trace(calls, dev_a, dev_b, dev_a[0][0].clone())
    assert host_kernel_calls == 0
    _assert_same(dev_a, cpu_a)
    _assert_same(got, want)
    for g, w in zip(got, want):
        assert g.stride() == w.stride()


def test_lists_on_another_device_than_the_current_one():
    if torch.mydev.device_count() < 2:
        pytest.skip("needs two mydev devices")
    cpu = _operands("cpu")
    dev = _operands("mydev:1")
    assert torch.mydev.current_device() == 0
    want = [CALLS["_foreach_addcdiv_.ScalarList"](*cpu), CALLS["_foreach_sqrt"](*cpu)]
    got = [CALLS["_foreach_addcdiv_.ScalarList"](*dev), CALLS["_foreach_sqrt"](*dev)]
    assert all(t.device == torch.device("mydev:1") for t in got[1])
    torch.mydev.synchronize(1)
    _assert_same(dev[0], cpu[0])
    _assert_same(got[1], want[1])


# -- optimizers ------------------------------------------------------------------------------------

OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    "sgd_nesterov_wd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                                                 foreach=True),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01, foreach=True),
    "adam_amsgrad_wd_maximize": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1, amsgrad=True,
                                                           maximize=True, foreach=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, foreach=True),
    "adamw_amsgrad": lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True, foreach=True),
}


@pytest.mark.parametrize("name", OPTIMIZERS.keys())
def test_optimizer_steps_equal_cpu(name):
    shapes = ((16, 16), (16,), (4, 16), (4,))
    g = torch.Generator().manual_seed(0)
    init = [torch.randn(*s, generator=g) for s in shapes]
    grads = [[torch.randn(*s, generator=g) for s in shapes] for _ in range(3)]
    params = {d: [t.clone().to(d).requires_grad_() for t in init] for d in ("cpu", "mydev")}
    opts = {d: OPTIMIZERS[name](params[d]) for d in params}
    for step in range(3):
        for d in params:
            for p, gr in zip(params[d], grads[step]):
                p.grad = gr.to(d)
        opts["cpu"].step()
        _, _, host_kernel_calls = _run_and_trace(opts["mydev"].step)
        # Every op of the step on mydev was a foreach op of ForeachOps.cpp.
        assert host_kernel_calls == 0, step
        with torch.no_grad():
            _assert_same(params["mydev"], params["cpu"])


# -- errors ----------------------------------------------------------------------------------------

def _message(e):
    return re.sub(r"mydev:0|cpu", "DEVICE", str(e))


ERRORS = {
    "lists_of_different_lengths": lambda a, b, c, d, s: torch._foreach_add_(a[:3], b),
    "empty_list": lambda a, b, c, d, s: torch._foreach_mul_([], 2.0),
    "scalars_of_another_length": lambda a, b, c, d, s: torch._foreach_div_(a, [1.0, 2.0]),
    "addcdiv_scalars_of_another_length": lambda a, b, c, d, s: torch._foreach_addcdiv_(a, b, d, [1.0]),
    "shapes_that_do_not_broadcast": lambda a, b, c, d, s: torch._foreach_add_(a, [t[:3, :5] for t in b]),
    # (The CPU has written the first two entries when it raises; mydev has written nothing.)
    "shapes_that_do_not_broadcast_in_the_third_entry":
        lambda a, b, c, d, s: torch._foreach_lerp_(a, [b[0], b[1], b[2][:3], b[3]], 0.5),
    "in_place_result_of_another_shape": lambda a, b, c, d, s: torch._foreach_mul_([t[0] for t in a], b),
    "in_place_result_of_another_dtype": lambda a, b, c, d, s: torch._foreach_mul_(a, [t.to(torch.complex64) for t in b]),
    "complex_alpha": lambda a, b, c, d, s: torch._foreach_add_(a, b, alpha=1j),
    "complex_value_per_tensor": lambda a, b, c, d, s: torch._foreach_addcmul_(a, b, c, [1j, 1, 1, 1]),
    "bool_alpha": lambda a, b, c, d, s: torch._foreach_add(a, b, alpha=True),
    "float_overflowing_value": lambda a, b, c, d, s: torch._foreach_lerp_(a, b, 1e300),
    "mul_by_a_non_scalar_tensor": lambda a, b, c, d, s: torch._foreach_mul_(a, b[0]),
    "partial_overlap": lambda a, b, c, d, s: torch._foreach_add_([a[0][1:], a[1]], [a[0][:-1], b[1]]),
    "out_of_place_lists_of_different_lengths": lambda a, b, c, d, s: torch._foreach_div(a, b[:2]),
}


@pytest.mark.parametrize("name", ERRORS.keys())
def test_errors_are_cpus_and_the_device_still_works(name):
    fn = ERRORS[name]
    cpu, dev = _operands("cpu"), _operands("mydev")
    before = [[t.cpu() for t in lst] for lst in dev[:4]]
    with pytest.raises(Exception) as cpu_error:
        fn(*cpu)
    with pytest.raises(type(cpu_error.value)) as dev_error:
        fn(*dev)
    assert _message(dev_error.value) == _message(cpu_error.value)
    # Raised at the call, before anything was queued: nothing was written,
    # nothing fails later, and the lists still work.
    torch.mydev.synchronize()
    for lst, old in zip(dev, before):
        _assert_same(lst, old)
    cpu = _operands("cpu")
    CALLS["_foreach_addcdiv_.ScalarList"](*cpu)
    CALLS["_foreach_addcdiv_.ScalarList"](*dev)
    _assert_same(dev[0], cpu[0])


@pytest.mark.parametrize("other", ["cpu", "mydev:1"])
def test_lists_on_two_devices_are_rejected_at_the_call(other):
    if other == "mydev:1" and torch.mydev.device_count() < 2:
        pytest.skip("needs two mydev devices")
    a, b = _lists("mydev"), _lists(other, seed=1)
    for fn in (lambda: torch._foreach_add_(a, b), lambda: torch._foreach_lerp_(a, b, 0.5),
               lambda: torch._foreach_maximum(a, b), lambda: torch._foreach_addcdiv_(a, b, b, [1.0] * 4)):
        with pytest.raises(RuntimeError, match=f"Expected all tensors to be on the same device.*{other}"):
            fn()
    torch.mydev.synchronize()
    before = [t.cpu() for t in a]
    torch._foreach_add_(a, a)
    _assert_same(a, [2 * t for t in before])


# -- strict mode -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_fast_path_and_optimizer_steps_in_strict_mode(python_subprocess):
    # MYDEV_STRICT=1: a host read of device memory (a kernel that missed
    # use_kernel_addresses) crashes the process.
    r = python_subprocess("""
        import torch, my_device
        shapes = ((16, 16), (64, 64), (8,))
        g = torch.Generator().manual_seed(0)
        init = [torch.randn(*s, generator=g) for s in shapes]
        for make in (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
                     lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True, foreach=True)):
            params = {d: [t.clone().to(d).requires_grad_() for t in init] for d in ("cpu", "mydev")}
            opts = {d: make(params[d]) for d in params}
            for step in range(3):
                grads = [torch.randn(*s, generator=g) for s in shapes]
                for d in params:
                    for p, gr in zip(params[d], grads):
                        p.grad = gr.to(d)
                    opts[d].step()
            for p, q in zip(params["mydev"], params["cpu"]):
                torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=0, atol=0)
        a = [t.to("mydev") for t in init]
        b = [t.abs().to("mydev") + 1 for t in init]
        out = torch._foreach_div(torch._foreach_sqrt(b), a)
        torch._foreach_addcdiv_(a, b, b, [0.5, 1, 2])
        want = torch._foreach_div(torch._foreach_sqrt([t.abs() + 1 for t in init]), init)
        for x, y in zip(out, want):
            torch.testing.assert_close(x.cpu(), y, rtol=0, atol=0)
        print("ok")
    """, env={"MYDEV_STRICT": "1"}, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr[-3000:]


def test_entries_that_share_memory_never_run_side_by_side():
    # A list big enough runs in two blocks of entries on the compute units, unless an entry writes memory
    # another one reads: here y's first row reads x's first column, every row of the x the first entry writes.
    x, y = torch.randn(640, 640), torch.randn(640, 640)
    want_x, want_y = x.clone(), y.clone()
    torch._foreach_add_([want_x, want_y], [want_y, want_x.t()])
    for _ in range(10):
        xd, yd = x.to("mydev"), y.to("mydev")
        torch._foreach_add_([xd, yd], [yd, xd.t()])
        assert torch.equal(xd.cpu(), want_x) and torch.equal(yd.cpu(), want_y)
    # Entries without shared memory do share the units, with the CPU's bits.
    lists = [[torch.randn(640, 640) for _ in range(2)] for _ in range(2)]
    before = my_device._C._test_blocks_run_by_other_units()
    for _ in range(10):
        got = torch._foreach_mul([t.to("mydev") for t in lists[0]], [t.to("mydev") for t in lists[1]])
        assert all(torch.equal(g.cpu(), a * b) for g, a, b in zip(got, *lists))
    assert my_device._C._test_blocks_run_by_other_units() > before
