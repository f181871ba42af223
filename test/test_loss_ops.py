"""nll_loss_forward and nll_loss_backward as queued structured kernels (csrc/native/LossOps.cpp):
results against the CPU's, where their errors come from (at the call, or, for a target index out of
range, at the next synchronisation as CUDA's device-side assert), and that the device works after."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import my_device

from conftest import delayed

aten = torch.ops.aten
N_CLASSES = 5


def queued(fn):
    """Runs fn() with the default stream held back: (result, whether it was queued)."""
    s = torch.mydev.default_stream()
    torch.mydev.synchronize()
    with delayed(s, us=20_000):
        result = fn()
        pending = not s.query()
    return result, pending


def host_kernel_calls(fn):
    """How many calls fn() sent to the generic host kernel (queued or at the call)."""
    torch.mydev.synchronize()
    my_device._C._host_kernel_breakdown(True)
    try:
        fn()
        torch.mydev.synchronize()
    finally:
        counts = dict(my_device._C._host_kernel_breakdown(False))
    return counts["queued"] + counts["inline"]


def to_mydev(t):
    return None if t is None else t.to("mydev")


def make_case(dims, batch, dtype, weighted, ignore_index, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*((batch, N_CLASSES) if dims == 2 else (N_CLASSES,)), dtype=dtype, generator=g)
    target = torch.randint(0, N_CLASSES, (batch,) if dims == 2 else (), generator=g)
    if dims == 2 and batch > 1:
        target[1] = 2                      # (an ignore_index of 2 then ignores at least one row)
    weight = torch.rand(N_CLASSES, dtype=dtype, generator=g) if weighted else None
    return x, target, weight


CASES = [c for c in itertools.product((1, 2), ("none", "mean", "sum"), (False, True), (-100, 2),
                                      (torch.float32, torch.float64))]


@pytest.mark.parametrize("dims,reduction,weighted,ignore_index,dtype", CASES)
def test_forward_and_backward_match_cpu(dims, reduction, weighted, ignore_index, dtype):
    x, target, weight = make_case(dims, 6, dtype, weighted, ignore_index)
    x.requires_grad_()
    want = F.nll_loss(x, target, weight=weight, reduction=reduction, ignore_index=ignore_index)
    grad = torch.randn_like(want)
    want.backward(grad)

    xd = x.detach().to("mydev").requires_grad_()
    got = F.nll_loss(xd, target.to("mydev"), weight=to_mydev(weight), reduction=reduction, ignore_index=ignore_index)
    got.backward(grad.to("mydev"))
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(xd.grad.cpu(), x.grad)


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("target_dtype", [torch.int64, torch.uint8])
def test_both_outputs_are_queued_and_match_cpu(reduction, target_dtype):
    x, target, weight = make_case(2, 8, torch.float32, True, 2, seed=1)
    target = target.to(target_dtype)
    want, want_total = aten.nll_loss_forward(x, target, weight, reduction, 2)
    args = (x.to("mydev"), target.to("mydev"), weight.to("mydev"), reduction, 2)
    assert host_kernel_calls(lambda: aten.nll_loss_forward(*args)) == 0
    (got, got_total), was_queued = queued(lambda: aten.nll_loss_forward(*args))
    assert was_queued
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(got_total.cpu(), want_total)

    grad_out = torch.randn_like(want)
    want_grad = aten.nll_loss_backward(grad_out, x, target, weight, reduction, 2, want_total)
    bargs = (grad_out.to("mydev"), *args[:-1], 2, got_total)
    assert host_kernel_calls(lambda: aten.nll_loss_backward(*bargs)) == 0
    got_grad, was_queued = queued(lambda: aten.nll_loss_backward(*bargs))
    assert was_queued
    torch.testing.assert_close(got_grad.cpu(), want_grad)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_an_empty_batch_matches_cpu(reduction):
    # (the CPU kernel fills the outputs with other ops: NaN for a mean over nothing)
    x, target = torch.randn(0, N_CLASSES), torch.zeros(0, dtype=torch.long)
    want = F.nll_loss(x, target, reduction=reduction)
    got = F.nll_loss(x.to("mydev"), target.to("mydev"), reduction=reduction)
    torch.testing.assert_close(got.cpu(), want, equal_nan=True)


def test_a_non_contiguous_input_and_half_precision_match_cpu():
    x, target, weight = make_case(2, 6, torch.float32, True, -100, seed=2)
    wide = torch.randn(6, 2 * N_CLASSES)
    strided = wide[:, ::2]
    torch.testing.assert_close(F.nll_loss(strided.to("mydev")[:, :], target.to("mydev"), weight=to_mydev(weight)).cpu(),
                               F.nll_loss(strided, target, weight=weight))
    torch.testing.assert_close(F.nll_loss(wide.to("mydev")[:, ::2], target.to("mydev")).cpu(),
                               F.nll_loss(strided, target))
    torch.testing.assert_close(F.nll_loss(x.half().to("mydev"), target.to("mydev")).cpu(),
                               F.nll_loss(x.half(), target))


@pytest.mark.parametrize("targets", ["classes", "classes, label smoothing", "probabilities"])
def test_cross_entropy_and_its_gradient_match_cpu(targets):
    # Class targets reach nll_loss_forward/backward; probability targets are a
    # log_softmax, a product and a sum (they never reach these kernels).
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, N_CLASSES, generator=g, requires_grad=True)
    if targets.startswith("classes"):
        y = torch.randint(0, N_CLASSES, (8,), generator=g)
    else:
        y = torch.randn(8, N_CLASSES, generator=g).softmax(1)
    smoothing = 0.1 if "smoothing" in targets else 0.0
    want = F.cross_entropy(x, y, label_smoothing=smoothing)
    want.backward()
    xd = x.detach().to("mydev").requires_grad_()
    got = F.cross_entropy(xd, y.to("mydev"), label_smoothing=smoothing)
    got.backward()
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(xd.grad.cpu(), x.grad)


def test_nll_loss2d_still_matches_cpu():
    # (not structured in torch 2.13: the host kernel serves it)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, N_CLASSES, 3, 4, generator=g, requires_grad=True)
    y = torch.randint(0, N_CLASSES, (2, 3, 4), generator=g)
    want = F.nll_loss(x, y)
    want.backward()
    xd = x.detach().to("mydev").requires_grad_()
    got = F.nll_loss(xd, y.to("mydev"))
    got.backward()
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(xd.grad.cpu(), x.grad)


def device_still_works(x, target):
    torch.testing.assert_close(F.nll_loss(x.to("mydev"), target.to("mydev")).cpu(), F.nll_loss(x, target))
    assert (torch.ones(3, device="mydev") * 2).sum().item() == 6.0


X, T = torch.randn(4, N_CLASSES), torch.tensor([1, 0, 4, 2])
TW = torch.tensor(1.0)

# Errors the CPU raises before reading a value: mydev raises them at the call, with the CPU's type and message.
CALL_ERRORS = {
    "target dtype": lambda d: F.nll_loss(X.to(d), T.float().to(d)),
    "input dtype": lambda d: F.nll_loss(X.long().to(d), T.to(d)),
    "weight dtype": lambda d: F.nll_loss(X.to(d), T.to(d), weight=torch.ones(N_CLASSES, dtype=torch.double).to(d)),
    "weight size": lambda d: F.nll_loss(X.to(d), T.to(d), weight=torch.ones(4).to(d)),
    "batch size": lambda d: F.nll_loss(X.to(d), T[:3].to(d)),
    "3-d input": lambda d: aten.nll_loss_forward(X.view(2, 2, N_CLASSES).to(d), T[:2].to(d), None, 1, -100),
    "0-d target of a 2-d input": lambda d: aten.nll_loss_forward(X.to(d), T[0].to(d), None, 1, -100),
    "backward: total_weight size": lambda d: aten.nll_loss_backward(TW.to(d), X.to(d), T.to(d), None, 1, -100,
                                                                    torch.ones(2).to(d)),
    "backward: grad_output size": lambda d: aten.nll_loss_backward(torch.ones(3).to(d), X.to(d), T.to(d), None, 0,
                                                                   -100, TW.to(d)),
    "backward: total_weight dtype": lambda d: aten.nll_loss_backward(TW.to(d), X.to(d), T.to(d), None, 1, -100,
                                                                     TW.double().to(d)),
}


@pytest.mark.parametrize("name", list(CALL_ERRORS))
def test_argument_errors_are_raised_at_the_call_as_on_cpu(name):
    fn = CALL_ERRORS[name]
    with pytest.raises(Exception) as cpu_error:
        fn("cpu")
    for _ in range(2):                         # (not only a dtype signature's first call)
        with pytest.raises(type(cpu_error.value)) as dev_error:
            fn("mydev")
        assert str(dev_error.value).split("\n")[0] == str(cpu_error.value).split("\n")[0]
    torch.mydev.synchronize()                  # nothing was queued that fails
    device_still_works(X, T)


def test_a_target_on_another_device_is_refused():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.* target is on cpu"):
        aten.nll_loss_forward(X.to("mydev"), T, None, 1, -100)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.* weight is on cpu"):
        aten.nll_loss_backward(TW.to("mydev"), X.to("mydev"), T.to("mydev"), torch.ones(N_CLASSES), 1, -100,
                               TW.to("mydev"))
    device_still_works(X, T)


BAD_TARGETS = {
    "forward, mean": (lambda x, t: F.nll_loss(x, t), "aten::nll_loss_forward"),
    "forward, no reduction": (lambda x, t: F.nll_loss(x, t, reduction="none"), "aten::nll_loss_forward"),
    "forward, 1-d input": (lambda x, t: F.nll_loss(x[0], t[2]), "aten::nll_loss_forward"),
    "backward, sum": (lambda x, t: aten.nll_loss_backward(torch.ones((), device=x.device), x, t, None, 2, -100,
                                                          torch.ones((), device=x.device)), "aten::nll_loss_backward"),
}


@pytest.mark.parametrize("bad", [7, -1])
@pytest.mark.parametrize("name", list(BAD_TARGETS))
def test_a_target_out_of_range_is_reported_at_the_next_sync(name, bad):
    # The CPU kernel finds it while it runs and raises at the call; queued on
    # mydev, the next synchronisation raises it, naming the op, as CUDA
    # reports a device-side assert. The device stays usable.
    fn, op = BAD_TARGETS[name]
    t = T.clone()
    t[2] = bad
    with pytest.raises(IndexError, match=f"Target {bad} is out of bounds."):
        fn(X, t)
    fn(X.to("mydev"), T.to("mydev"))
    torch.mydev.synchronize()
    fn(X.to("mydev"), t.to("mydev"))           # no error yet
    with pytest.raises(IndexError, match=f"a kernel failed on mydev:0: {op}: Target {bad} is out of bounds."):
        torch.mydev.synchronize()
    torch.mydev.synchronize()                  # reported once
    device_still_works(X, T)


def test_a_bad_target_is_raised_at_the_launch_under_launch_blocking(python_subprocess):
    r = python_subprocess("""
        import torch, my_device
        import torch.nn.functional as F
        x = torch.randn(4, 5, device="mydev")
        F.nll_loss(x, torch.tensor([1, 3, 0, 2], device="mydev"))  # (a dtype signature's first call runs at the call)
        try:
            F.nll_loss(x, torch.tensor([1, 9, 0, 2], device="mydev"))
        except IndexError as e:                # (the CPU's type)
            assert "aten::nll_loss_forward: Target 9 is out of bounds." in str(e), e
        else:
            raise SystemExit("no error at the launch")
        torch.mydev.synchronize()
        t = torch.tensor([1, 3, 0, 2])
        torch.testing.assert_close(F.nll_loss(x, t.to("mydev")).cpu(), F.nll_loss(x.cpu(), t))
        print("ok")
    """, env={"MYDEV_LAUNCH_BLOCKING": "1"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


# The structured kernels outside TensorIterator (nll_loss, softmax, sum, mm) map
# their operands to the host at the call: a caller restriding an input or an
# output after the launch changes nothing the queued kernel reads or writes.
RESTRIDE = {
    "nll_loss_forward": lambda x, t: aten.nll_loss_forward(x, t, None, 0, -100)[0],
    "log_softmax": lambda x, t: torch.log_softmax(x, 0),
    "sum": lambda x, t: x.sum(1),
    "mm": lambda x, t: torch.mm(x, x.t()),
}


@pytest.mark.parametrize("name", list(RESTRIDE))
def test_a_queued_kernel_reads_and_writes_the_geometry_of_the_launch(name):
    fn = RESTRIDE[name]
    x, t = torch.randn(4, 4), torch.tensor([0, 3, 1, 2])
    want = fn(x, t)
    dx = x.to("mydev")
    fn(dx, t.to("mydev"))  # (a dtype signature's first call runs at the call; later ones queue)
    s = torch.mydev.default_stream()
    torch.mydev.synchronize()
    with delayed(s, us=20_000):
        got = fn(dx, t.to("mydev"))
        assert not s.query()                   # queued, not run yet
        dx.t_()
        if got.dim() == 2:
            got.t_()
    torch.testing.assert_close(got.cpu(), want.t() if want.dim() == 2 else want)
    torch.testing.assert_close(dx.cpu(), x.t())
