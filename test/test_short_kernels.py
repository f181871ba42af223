"""Short structured kernels outside TensorIterator (softmax, sum, mm/addmm/bmm, nll_loss) on an idle
stream run at the call: over the caller's own device tensors where the family file opted in
(RunsOnDeviceTensors), the ops they call on them running at once inside them (launch_is_nested),
otherwise over host aliases of those tensors, which a thread's later calls reuse (StructuredKernel.h:
queue_functional, HostOperands). Results against the CPU's, errors at the call as the CPU's, the
queued path when the stream is busy, and strict and blocking modes in subprocesses."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import my_device  # noqa: F401

from conftest import delayed, host_aliases


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, dtype=dtype, generator=g)  # noqa: E731
    return {"a": r(4, 16), "sq": r(16, 16), "w": r(16, 8), "bias": r(8), "b3": r(3, 4, 5), "c3": r(3, 5, 2),
            "target": torch.randint(0, 16, (4,), generator=g), "cw": torch.rand(16, dtype=dtype, generator=g),
            "big": r(96, 64)}


OPS = {
    "sum": lambda d: d["a"].sum(),
    "sum_dim": lambda d: d["a"].sum(0, keepdim=True),
    "sum_dtype": lambda d: d["a"].sum(1, dtype=torch.float64),
    "log_softmax": lambda d: torch.log_softmax(d["a"], 1),
    "softmax_t": lambda d: torch.softmax(d["a"].t(), 0),
    "nll_loss": lambda d: F.nll_loss(torch.log_softmax(d["a"], 1), d["target"]),
    "nll_loss_weighted": lambda d: F.nll_loss(d["a"], d["target"], weight=d["cw"], reduction="sum"),
    "nll_loss_none": lambda d: F.nll_loss(d["a"], d["target"], ignore_index=3, reduction="none"),
    "mm": lambda d: torch.mm(d["a"], d["w"]),
    "mm_same_tensor": lambda d: torch.mm(d["sq"], d["sq"]),
    "mm_transposed": lambda d: torch.mm(d["sq"].t(), d["sq"][:, :8]),
    "addmm": lambda d: torch.addmm(d["bias"], d["a"], d["w"]),
    "addmm_scaled": lambda d: torch.addmm(d["bias"], d["a"], d["w"], beta=0.5, alpha=-2.0),
    "addmm_self_aliases_mat": lambda d: torch.addmm(d["sq"][0], d["sq"][:4], d["sq"]),
    "bmm": lambda d: torch.bmm(d["b3"], d["c3"]),
    # Copies between tensors of the device that convert or restride (copy_at_call in Copy.cpp).
    "contiguous_t": lambda d: d["a"].t().contiguous(),
    "to_half_strided": lambda d: d["a"][:, ::2].to(torch.float16),
    "to_bfloat16": lambda d: d["a"].to(torch.bfloat16),   # (the CPU's kernel reads the tensors' pointers)
    "copy_broadcast": lambda d: torch.empty_like(d["a"]).copy_(d["a"][1]),
    "addmm_dense_bias": lambda d: torch.addmm(d["a"][:, :8].contiguous(), d["a"], d["w"]),
    # Copies above the short size: queued on an idle stream by default (the copy loop, or the CPU's
    # blocked transpose for a transposed matrix), at the call under MYDEV_LAUNCH_BLOCKING.
    "contiguous_permute_big": lambda d: d["big"].view(8, 12, 64).permute(1, 0, 2).contiguous(),
    "to_half_big": lambda d: d["big"][:, 1:].to(torch.float16),
    "contiguous_t_big": lambda d: d["big"].t().contiguous(),
    # Fills other than a dense memset (fill_at_call in Fill.cpp).
    "ones_like": lambda d: torch.ones_like(d["a"]),
    "fill_strided": lambda d: d["a"].clone()[:, ::3].fill_(-2.5),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_results_match_cpu_at_the_call_and_queued(dtype):
    cpu = _inputs(dtype)
    dev = {k: v.to("mydev") for k, v in cpu.items()}
    s = torch.mydev.default_stream()
    # Twice at the call (the second time over pooled aliases), then queued behind a held-back stream.
    for _ in range(2):
        for name, fn in OPS.items():
            torch.mydev.synchronize()
            torch.testing.assert_close(fn(dev).cpu(), fn(cpu), msg=name)
    # A host kernel's first call of a signature runs at the call, after the stream's queued work, so that its
    # errors come there; the calls above ran at the call on an idle stream without making it (a strided fill),
    # and a first call made below would leave the stream idle (this failed when no earlier test had made it).
    with delayed(s):
        for fn in OPS.values():
            fn(dev)
    with delayed(s):
        results = {name: fn(dev) for name, fn in OPS.items()}
        assert not s.query()
    for name, fn in OPS.items():
        torch.testing.assert_close(results[name].cpu(), fn(cpu), msg=name)


def test_pooled_aliases_take_each_calls_geometry_and_dtype():
    # Alternating shapes, strides, offsets and dtypes through the same thread's pooled aliases.
    for i in range(40):
        dtype = torch.float64 if i % 3 == 0 else torch.float32
        rows = 1 + i % 5
        x = torch.randn(rows + 2, 7 + i % 4, dtype=dtype)
        view = x[1:rows + 1, 1:] if i % 2 else x[1:rows + 1].t()
        d = x.to("mydev")
        dview = d[1:rows + 1, 1:] if i % 2 else d[1:rows + 1].t()
        torch.testing.assert_close(torch.log_softmax(dview, -1).cpu(), torch.log_softmax(view, -1))
        torch.testing.assert_close(dview.sum(0).cpu(), view.sum(0))
        torch.testing.assert_close(torch.mm(dview, dview.t()).cpu(), torch.mm(view, view.t()))


def test_caller_restriding_after_a_queued_call_changes_nothing():
    cpu = _inputs(torch.float32)
    a, w, bias = (cpu[k].to("mydev") for k in ("a", "w", "bias"))
    s = torch.mydev.default_stream()
    torch.mydev.synchronize()
    with delayed(s):
        out_sm = torch.log_softmax(a, 1)
        out_mm = torch.addmm(bias, a, w)
        out_sum = a.sum(1)
        assert not s.query()
        a.t_()                       # the caller restrides its tensors before the kernels ran
        w.resize_(2, 2)
        bias.resize_(0)
    torch.testing.assert_close(out_sm.cpu(), torch.log_softmax(cpu["a"], 1))
    torch.testing.assert_close(out_mm.cpu(), torch.addmm(cpu["bias"], cpu["a"], cpu["w"]))
    torch.testing.assert_close(out_sum.cpu(), cpu["a"].sum(1))


def _cpu_error(fn, cpu):
    with pytest.raises(Exception) as info:
        fn(cpu)
    return type(info.value), str(info.value).split("\n")[0]


@pytest.mark.parametrize("name,fn", [
    ("mm_shapes", lambda d: torch.mm(d["a"], d["a"])),
    ("addmm_shapes", lambda d: torch.addmm(d["bias"], d["w"], d["a"])),
    ("bmm_batch", lambda d: torch.bmm(d["b3"], d["c3"][:2])),
    ("log_softmax_dim", lambda d: torch.log_softmax(d["a"], 3)),
    ("sum_dim", lambda d: d["a"].sum(5)),
    ("nll_loss_batch", lambda d: F.nll_loss(d["a"], d["target"][:3])),
    ("nll_loss_weight", lambda d: F.nll_loss(d["a"], d["target"], weight=d["cw"][:3])),
])
def test_errors_come_at_the_call_as_on_cpu(name, fn):
    cpu = _inputs(torch.float32)
    dev = {k: v.to("mydev") for k, v in cpu.items()}
    torch.mydev.synchronize()
    expected_type, expected_message = _cpu_error(fn, cpu)
    with pytest.raises(expected_type) as info:
        fn(dev)
    assert str(info.value).split("\n")[0] == expected_message
    torch.mydev.synchronize()        # nothing left behind to report
    torch.testing.assert_close(torch.log_softmax(dev["a"], 1).cpu(), torch.log_softmax(cpu["a"], 1))


def test_target_out_of_range_at_the_call_is_reported_at_the_next_synchronisation():
    # As a queued kernel's failure (a device-side assert on CUDA); the device works after.
    x = torch.randn(4, 5)
    d = x.to("mydev")
    target = torch.tensor([0, 7, 1, 2], device="mydev")
    torch.mydev.synchronize()
    F.nll_loss(d, target)
    with pytest.raises(IndexError, match="out of bounds"):
        torch.mydev.synchronize()
    t = torch.tensor([0, 4, 1, 2])
    torch.testing.assert_close(F.nll_loss(d, t.to("mydev")).cpu(), F.nll_loss(x, t))


@pytest.mark.slow
@pytest.mark.parametrize("env", [{"MYDEV_STRICT": "1"}, {"MYDEV_LAUNCH_BLOCKING": "1"}], ids=["strict", "blocking"])
def test_other_modes_at_the_call_and_queued(env):
    # MYDEV_STRICT=1: a device address read by host code (a kernel included) crashes the process.
    # MYDEV_LAUNCH_BLOCKING=1: every launch runs at the call, in stream order, nested ones included.
    script = textwrap.dedent("""
        import torch, torch.nn.functional as F, my_device
        from conftest import delayed
        import test_short_kernels as t
        cpu = t._inputs(torch.float32)
        dev = {k: v.to("mydev") for k, v in cpu.items()}
        for queued in (False, False, True):
            torch.mydev.synchronize()
            if queued:
                with delayed(torch.mydev.default_stream()):
                    out = {n: fn(dev) for n, fn in t.OPS.items()}
            else:
                out = {n: fn(dev) for n, fn in t.OPS.items()}
            for n, fn in t.OPS.items():
                torch.testing.assert_close(out[n].cpu(), fn(cpu), msg=n)
        for n, (fn, args) in t._at_call_cases().items():
            torch.testing.assert_close(fn([a.to("mydev") for a in args]).cpu(), fn(args), rtol=0, atol=0, msg=n)
        print("mode ok")
    """)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, **env,
               PYTHONPATH=os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                       cwd=here)
    assert r.returncode == 0 and "mode ok" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim", [((4, 16), 1), ((4, 16), 0), ((2, 3, 5), 1), ((), 0)],
                         ids=["lastdim", "dim0", "middle", "0d"])
def test_softmax_on_the_device_tensors_themselves(fn, shape, dim):
    # Outside strict mode a short softmax on contiguous tensors runs over the caller's tensors, with no
    # host aliases (RunsOnDeviceTensors in StructuredKernel.h); forward and backward against the CPU.
    x = torch.randn(shape, dtype=torch.float64)
    g = torch.randn(shape, dtype=torch.float64)
    xd = x.to("mydev").requires_grad_()
    xc = x.clone().requires_grad_()
    yd, yc = fn(xd, dim), fn(xc, dim)
    yd.backward(g.to("mydev"))
    yc.backward(g)
    assert torch.equal(yd.detach().cpu(), yc.detach())
    assert torch.equal(xd.grad.cpu(), xc.grad)
    # A non-contiguous input: impl() makes it contiguous with an op, run at once inside it.
    t = torch.randn(16, 4, dtype=torch.float64)
    td = t.to("mydev")
    got, aliases = host_aliases(lambda: fn(td.t(), 1))
    assert torch.equal(got.cpu(), fn(t.t(), 1))
    assert aliases == 0


def test_cat_and_argmax_on_the_device_tensors_themselves():
    # Contiguous inputs of one floating dtype take cat's memcpy or serial loop, and argmax its reduction,
    # over the caller's tensors (RunsOnDeviceTensors in TensorShape.cpp, ReduceOps.cpp); a cat of
    # transposed inputs may take a TensorIterator copy, and aliases its operands.
    x = torch.randn(4, 6, 8)
    d = x.to("mydev")
    cases = [(lambda t: torch.cat([t, t * 2], 2), 0), (lambda t: torch.cat([t[0], t[1]]), 0),
             (lambda t: t.argmax(-1), 0), (lambda t: t.argmin(), 0), (lambda t: t[:, :1].argmax(1), 0),
             (lambda t: torch.cat([t.transpose(1, 2), t.transpose(1, 2)], 1), 3)]
    for fn, want_aliases in cases:
        fn(d)
        torch.mydev.synchronize()
        got, aliases = host_aliases(lambda: fn(d))
        assert torch.equal(got.cpu(), fn(x))
        assert aliases == want_aliases


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
def test_nll_loss_on_the_device_tensors_themselves(reduction, weighted):
    # nll_loss forward and backward run over the caller's tensors (RunsOnDeviceTensors in
    # LossOps.cpp), an empty target's fills and a strided weight's contiguous() inside them.
    x = torch.log_softmax(torch.randn(6, 5, dtype=torch.float64), 1)
    t = torch.tensor([0, 4, 2, -100, 1, 3])
    w = torch.rand(5, dtype=torch.float64) if weighted else None
    kw = dict(reduction=reduction, ignore_index=-100)
    to = lambda v: None if v is None else v.to("mydev")  # noqa: E731
    assert torch.equal(F.nll_loss(x.to("mydev"), t.to("mydev"), to(w), **kw).cpu(), F.nll_loss(x, t, w, **kw))
    empty_x, empty_t = torch.empty(0, 5, dtype=torch.float64), torch.empty(0, dtype=torch.long)
    got = F.nll_loss(empty_x.to("mydev"), empty_t.to("mydev"), to(w), **kw).cpu()
    assert torch.allclose(got, F.nll_loss(empty_x, empty_t, w, **kw), equal_nan=True)
    if weighted:
        wd = torch.rand(10, dtype=torch.float64)
        strided = wd.to("mydev")[::2]  # a view with stride 2 on the device
        assert not strided.is_contiguous()
        assert torch.equal(F.nll_loss(x.to("mydev"), t.to("mydev"), strided, **kw).cpu(),
                           F.nll_loss(x, t, wd[::2], **kw))


def _at_call_cases():
    g = torch.Generator().manual_seed(1)
    r = lambda *s, dtype=torch.float64: torch.randn(*s, dtype=dtype, generator=g)  # noqa: E731
    a, sq, w, bias, col = r(4, 16), r(16, 16), r(16, 8), r(8), r(4, 1)
    ints = torch.randint(-5, 5, (4, 16), generator=g)
    return {
        # sum: zero_() of an empty input, fill_() of the cascade sum's output, all inside the kernel.
        "sum_all": (lambda t: t[0].sum(), [a]),
        "sum_dims_keepdim": (lambda t: t[0].sum((0, 1), keepdim=True), [a]),
        "sum_dim1_float32": (lambda t: t[0].sum(1, dtype=torch.float32), [a]),
        "sum_strided": (lambda t: t[0][:, ::3].t().sum(0), [a]),
        "sum_int": (lambda t: t[0].sum(1), [ints]),
        "sum_empty": (lambda t: t[0][:0].sum(0), [a]),
        # mm/addmm: transposed operands go to BLAS as they are; one BLAS cannot take is cloned;
        # addmm copies its (broadcast) bias into its output first, unless beta is 0.
        "mm": (lambda t: torch.mm(t[0], t[1]), [a, w]),
        "mm_transposed": (lambda t: torch.mm(t[1].t(), t[0].t()), [a, w]),
        "mm_cloned_operand": (lambda t: torch.mm(t[0][:, ::2], t[1][::2]), [a, w]),
        "mm_empty_k": (lambda t: torch.mm(t[0][:, :0], t[1][:0]), [a, w]),
        "addmm": (lambda t: torch.addmm(t[2], t[0], t[1]), [a, w, bias]),
        "addmm_linear": (lambda t: torch.addmm(t[2], t[0], t[1].t()), [a, sq[:8], bias]),
        "addmm_column_bias": (lambda t: torch.addmm(t[2], t[0], t[1], beta=-0.5, alpha=3.0), [a, w, col]),
        "addmm_beta0": (lambda t: torch.addmm(t[2], t[0], t[1], beta=0), [a, w, bias.clone().fill_(float("nan"))]),
        "addmm_self_is_mat": (lambda t: torch.addmm(t[0][:4, :4], t[0][:4], t[0][:, :4]), [sq]),
        # A dense bias: its copy into the output would be a runtime memcpy, queued behind the kernel.
        "addmm_dense_bias": (lambda t: torch.addmm(t[2], t[0], t[1]), [a, w, r(4, 8)]),
    }


@pytest.mark.parametrize("name", list(_at_call_cases()))
def test_at_the_call_over_the_device_tensors_themselves(name):
    # Each runs at the call, over the caller's device tensors (no host alias made); the ops its CPU
    # impl() calls on them run at once inside it (launch_is_nested). Bit for bit the CPU's result:
    # the same loops over the same bytes with the same strides.
    fn, cpu = _at_call_cases()[name]
    dev = [t.to("mydev") for t in cpu]
    fn(dev)  # a dtype's first call runs through host aliases, to raise the CPU's errors at the call
    got, aliases = host_aliases(lambda: fn(dev))
    expected = fn(cpu)
    assert got.dtype == expected.dtype and got.shape == expected.shape and got.stride() == expected.stride()
    assert torch.equal(got.cpu(), expected)
    assert aliases == 0
    # The inputs are untouched, and the device works on.
    for d, c in zip(dev, cpu):
        torch.testing.assert_close(d.cpu(), c, rtol=0, atol=0, equal_nan=True)


def test_a_reduced_float_sum_takes_the_host_aliases():
    # bfloat16: the CPU's sum takes an extra-precision path for CPU iterators only
    # (should_use_acc_buffer), so RunsOnDeviceTensors<sum>::accepts turns it down.
    base = torch.randn(8, 3, 5).to(torch.bfloat16)
    x, xd = base.permute(2, 0, 1), base.to("mydev").permute(2, 0, 1)
    got, aliases = host_aliases(lambda: xd.sum((1, 2)))
    assert torch.equal(got.cpu(), x.sum((1, 2)))
    assert aliases > 0


def test_nested_ops_of_a_call_on_a_busy_stream_stay_in_order():
    # Queued behind held-back work, the same calls run over host aliases on the worker, after what
    # was queued before them (an in-place update of their input).
    a = torch.randn(4, 16, dtype=torch.float64)
    w = torch.randn(16, 8, dtype=torch.float64)
    ad, wd = a.to("mydev"), w.to("mydev")
    s = torch.mydev.default_stream()
    torch.mydev.synchronize()
    with delayed(s):
        ad.mul_(2)
        total, prod = ad[:, ::2].sum(0), torch.addmm(wd[0], ad, wd)
        assert not s.query()
    torch.testing.assert_close(total.cpu(), (a * 2)[:, ::2].sum(0), rtol=0, atol=0)
    torch.testing.assert_close(prod.cpu(), torch.addmm(w[0], a * 2, w), rtol=0, atol=0)
