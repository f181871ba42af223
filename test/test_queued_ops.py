"""Which op families are queued on the stream rather than run at the call, and
that queueing changes neither their results nor where their errors come from.

A call is queued when, with the stream's worker held back by the delay hook,
it returns and the stream still has work pending (`stream.query()` is False);
an op run at the call would first have waited for that work. Every result is
checked against the same computation on the CPU."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import my_device

from conftest import delayed, host_kernel_calls


def queued(fn, *args, us=20_000):
    """Runs fn(*args) with the default stream held back; returns (result, was it queued)."""
    s = torch.mydev.default_stream()
    torch.mydev.synchronize()
    with delayed(s, us=us):
        result = fn(*args)
        pending = not s.query()
    return result, pending


def to_cpu(result):
    if isinstance(result, (tuple, list)):
        return type(result)(to_cpu(r) for r in result)
    return result.cpu()


def check_queued_like_cpu(fn, *cpu_args, calls=2):
    # The first call of a signature runs at the call (where the CPU kernel makes
    # its checks); later ones are queued.
    dev_args = [a.to("mydev") if isinstance(a, torch.Tensor) else a for a in cpu_args]
    for _ in range(calls):
        got, was_queued = queued(fn, *dev_args)
    want = fn(*cpu_args)
    assert was_queued
    got = to_cpu(got)
    if isinstance(want, (tuple, list)):
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    else:
        torch.testing.assert_close(got, want)


X = torch.randn(4, 6, 8)


def foreach_mul_(x):
    params = [x.clone(), x * 2]
    torch._foreach_mul_(params, 0.5)   # an optimiser's step: per-tensor mul_, i.e. mul.out into self
    return params


@pytest.mark.parametrize("name,fn", [
    ("add out=", lambda x: torch.add(x, 1.0, out=torch.empty_like(x))),
    ("mul_ by a number (mul.out into self)", lambda x: x.clone().mul_(2.5)),
    ("abs (abs.out into an empty tensor)", lambda x: torch.abs(x)),
    ("sum out= an empty tensor", lambda x: torch.sum(x, 1, out=torch.empty(0, device=x.device))),
    ("foreach mul_", foreach_mul_),
])
def test_out_variants_are_queued(name, fn):
    check_queued_like_cpu(fn, X)


def test_out_variants_keep_the_callers_output_and_cpu_errors():
    d = X.to("mydev")
    out = torch.empty_like(d)
    torch.add(d, d, out=out)                   # (the signature's first call runs at the call)
    r, was_queued = queued(lambda: torch.add(d, d, out=out))
    assert was_queued and r is out
    torch.testing.assert_close(out.cpu(), X + X)
    # A non-empty output of the wrong shape is resized with PyTorch's warning, once.
    wrong = torch.empty(3, device="mydev")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.mul(d, d, out=wrong)
    assert len([w for w in caught if "resized" in str(w.message)]) == 1
    torch.testing.assert_close(wrong.cpu(), X * X)
    # Errors the Meta kernel cannot see still come at the call, while work is pending.
    s = torch.mydev.default_stream()
    flat = torch.randn(10, device="mydev")
    with delayed(s):
        with pytest.raises(RuntimeError, match="single memory location"):
            torch.add(flat[:5], flat[1:6], out=flat[2:7])
        with pytest.raises(RuntimeError, match="can't be cast"):
            torch.add(d, d, out=torch.empty(4, 6, 8, dtype=torch.long, device="mydev"))
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):  # (logical_and.out into self)
            torch.empty(0, 1, 3, device="mydev").logical_and_(torch.empty(0, 10, 3, device="mydev"))
    torch.mydev.synchronize()  # nothing left to report


@pytest.mark.parametrize("name,fn,args", [
    ("layer_norm", lambda x: F.layer_norm(x, (8,)), (X,)),
    ("group_norm", lambda x: F.group_norm(x.view(4, 6, 2, 4), 3), (X,)),
    ("relu", torch.relu, (X,)),
    ("flip", lambda x: torch.flip(x, [1]), (X,)),
    ("roll", lambda x: torch.roll(x, 2, 1), (X,)),
    ("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, 2), (X,)),
    ("dot", torch.dot, (X[0, 0], X[1, 1])),
    ("isnan", torch.isnan, (X,)),
    ("logsumexp", lambda x: torch.logsumexp(x, 1), (X,)),
])
def test_functional_ops_without_a_cpu_out_kernel_are_queued(name, fn, args):
    # (their functional CPU kernel runs on the worker; its results are copied
    # into the outputs allocated at the call)
    check_queued_like_cpu(fn, *args)


@pytest.mark.parametrize("name,fn", [
    ("cat", lambda x: torch.cat([x, x * 2], 1)),
    ("stack", lambda x: torch.stack([x, x])),
    ("sort", lambda x: torch.sort(x, -1)),
    ("topk", lambda x: torch.topk(x, 3, -1)),
    ("argmax", lambda x: x.argmax(-1)),
    ("max over a dim", lambda x: x.max(1)),
    ("var_mean", lambda x: torch.var_mean(x, -1)),
    ("masked_fill", lambda x: x.masked_fill(x > 0, 0.0)),
    ("scaled_dot_product_attention", lambda x: F.scaled_dot_product_attention(x, x, x)),
])
def test_selection_and_shaping_ops_are_queued(name, fn):
    check_queued_like_cpu(fn, X)


def assign_into_slice(x):
    out = torch.zeros(4, 6, 10, device=x.device)
    out[:, :, 1:9] = x                         # copy_ into a strided view
    return out


@pytest.mark.parametrize("name,fn", [
    ("to another dtype", lambda x: x.to(torch.float16)),
    ("to an integer dtype", lambda x: (x * 10).long()),
    ("contiguous of a transpose", lambda x: x.transpose(1, 2).contiguous()),
    ("contiguous of an expansion", lambda x: x[:, :1].expand(4, 6, 8).contiguous()),
    ("copy_ with broadcasting", lambda x: torch.empty(3, 4, 6, 8, device=x.device).copy_(x)),
    ("assignment into a slice", assign_into_slice),
    ("constant padding", lambda x: F.pad(x, (1, 2), value=0.5)),
    # (these three are the CPU's copy_ over host aliases on the worker; the others the copy loop)
    ("contiguous of a large transposed matrix", lambda x: x.reshape(-1).repeat(20).view(64, 60).t().contiguous()),
    ("copy of a negated view", lambda x: torch.empty_like(x).copy_(torch._neg_view(x.transpose(0, 2)).transpose(0, 2))),
    ("copy of a conjugated view", lambda x: torch.empty(4, 6, 4, dtype=torch.complex64, device=x.device).copy_(
        torch.view_as_complex(x.reshape(4, 6, 4, 2)).conj())),
])
def test_copies_that_convert_or_restride_are_queued(name, fn):
    check_queued_like_cpu(fn, X)


def test_copies_keep_cpu_errors_and_warnings_at_the_call():
    d = X.to("mydev")
    s = torch.mydev.default_stream()
    with delayed(s):
        with pytest.raises(RuntimeError, match="must match the size|expanded size"):
            torch.empty(5, device="mydev").copy_(d)
        with pytest.raises(RuntimeError, match="single memory location"):
            torch.zeros(1, 8, device="mydev").expand(4, 8).copy_(torch.randn(4, 8, device="mydev"))
        # The CPU kernel warns once per process (TORCH_WARN_ONCE); an earlier test may have used it up.
        warn_always = torch.is_warn_always_enabled()
        torch.set_warn_always(True)
        try:
            with pytest.warns(UserWarning, match="discards the imaginary part"):
                torch.empty(3, device="mydev").copy_(torch.randn(3, dtype=torch.complex64, device="mydev"))
        finally:
            torch.set_warn_always(warn_always)
    torch.mydev.synchronize()


I = torch.randint(-5, 5, (4, 6, 8))


@pytest.mark.parametrize("name,fn", [
    ("sum", lambda i: i.sum(1)),
    ("eq", lambda i: i == 3),
    ("clamp", lambda i: i.clamp(-2, 2)),
    ("cumsum", lambda i: i.cumsum(2)),
    ("fill (zeros)", lambda i: torch.zeros_like(i)),
    ("where", lambda i: torch.where(i > 0, i, -i)),
])
def test_integer_host_kernels_are_queued_after_their_first_call(name, fn):
    check_queued_like_cpu(fn, I, calls=3)


def test_numbers_that_do_not_fit_the_dtype_raise_at_the_call():
    # The CPU kernels check that a number converts to the tensor's dtype; so
    # does the queued path, before it queues (as CUDA checks on the host).
    f, i64, i8 = (torch.zeros(4, device="mydev", dtype=d) for d in (torch.float32, torch.int64, torch.int8))
    mask = torch.ones(4, dtype=torch.bool, device="mydev")
    for _ in range(2):  # (also once the integer calls' dtypes are known to the queued path)
        with delayed(torch.mydev.default_stream()):
            with pytest.raises(RuntimeError, match="cannot be converted to type float without overflow"):
                f.fill_(1e300)
            with pytest.raises(RuntimeError, match="cannot be converted to type int64_t without overflow"):
                i64.masked_fill(mask, 1e30)
            with pytest.raises(RuntimeError, match="cannot be converted to type int8_t without overflow"):
                i8.clamp(0, 1000)
            f.fill_(2.0), i64.masked_fill_(mask, 7), i8.clamp_(0, 100)   # these fit
    torch.mydev.synchronize()  # nothing left to report
    assert f.cpu().tolist() == [2.0] * 4 and i64.cpu().tolist() == [7] * 4


def test_integer_ops_that_check_values_run_at_the_call():
    a = torch.tensor([4, 6], device="mydev")
    zero = torch.tensor([0, 1], device="mydev")
    for _ in range(2):  # (also after a first call has run)
        with delayed(torch.mydev.default_stream()):
            with pytest.raises(RuntimeError, match="ZeroDivisionError"):
                torch.div(a, zero, rounding_mode="floor")
            with pytest.raises(RuntimeError, match="ZeroDivisionError"):
                torch.remainder(a, zero)
    torch.testing.assert_close(torch.div(a, a, rounding_mode="floor").cpu(), torch.tensor([1, 1]))


RANDOM = {
    "randn": lambda: torch.randn(64, device="mydev"),
    "rand": lambda: torch.rand(64, device="mydev"),
    "randint": lambda: torch.randint(0, 100, (64,), device="mydev"),
    "normal_": lambda: torch.empty(64, device="mydev").normal_(2.0, 3.0),
    "bernoulli_": lambda: torch.empty(64, device="mydev").bernoulli_(0.3),
    "dropout": lambda: F.dropout(torch.ones(64, device="mydev"), 0.5),
    "exponential_": lambda: torch.empty(64, device="mydev").exponential_(),
}


@pytest.mark.parametrize("name", list(RANDOM))
def test_random_ops_are_queued_and_reproducible(name):
    fn = RANDOM[name]
    fn()                                       # (an integer dtype's first call runs at the call)
    torch.mydev.manual_seed(7)
    first, was_queued = queued(fn)
    first = first.cpu()
    assert was_queued
    torch.mydev.manual_seed(7)
    torch.randn(64)                            # the CPU generator plays no part
    again, _ = queued(fn)
    assert torch.equal(again.cpu(), first)
    assert not torch.equal(fn().cpu(), first)  # and the generator moved on


def test_random_ops_draw_the_same_numbers_queued_or_at_the_call(python_subprocess):
    code = """
        import torch, my_device
        import torch.nn.functional as F
        torch.mydev.manual_seed(11)
        draws = [torch.randn(16, device="mydev"), torch.randint(0, 9, (16,), device="mydev"),
                 F.dropout(torch.ones(16, device="mydev"), 0.25), torch.rand(16, device="mydev")]
        print([d.cpu().tolist() for d in draws])
    """
    queued_run = python_subprocess(code)
    at_the_call = python_subprocess(code, env={"MYDEV_QUEUE_MIN_ELEMENTS": str(1 << 62)})
    assert queued_run.returncode == 0 and at_the_call.returncode == 0, queued_run.stderr + at_the_call.stderr
    assert queued_run.stdout == at_the_call.stdout


def test_random_op_argument_errors_come_at_the_call():
    # Meta kernels skip some of these checks; the CPU kernel makes them at the call.
    s = torch.mydev.default_stream()
    t = torch.empty(8, device="mydev")
    with delayed(s):
        with pytest.raises(RuntimeError, match="uniform_ expects"):
            t.uniform_(2, 1)
        with pytest.raises(RuntimeError, match="random_ expects 'from' to be less than 'to'"):
            t.random_(5, 2)
        with pytest.raises(RuntimeError, match="bernoulli_ expects p to be in"):
            t.bernoulli_(1.5)
        with pytest.raises(RuntimeError, match="normal expects std"):
            t.normal_(0, -1)
    torch.mydev.synchronize()  # nothing left to report
    # A failed call drew nothing: the stream of numbers is the one without it.
    torch.mydev.manual_seed(3)
    want = torch.rand(8, device="mydev").cpu()
    torch.mydev.manual_seed(3)
    with pytest.raises(RuntimeError):
        t.uniform_(2, 1)
    assert torch.equal(torch.rand(8, device="mydev").cpu(), want)


@pytest.mark.parametrize("targets", ["classes", "probabilities"])
def test_a_training_step_makes_the_host_wait_for_nothing(targets):
    # The demo's network, optimiser and loss. After a first step (which runs each
    # new dtype signature at the call once), a step is all queued: sync debug
    # mode "error" raises on any operation that waits for the device.
    from my_device import demo
    torch.manual_seed(0)
    model = demo.SmallNet().to("mydev")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(8, 3, 16, 16, device="mydev")
    if targets == "classes":
        y = torch.randint(0, 10, (8,)).to("mydev")
    else:
        y = torch.randn(8, 10, device="mydev").softmax(1)

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    step()
    try:
        torch.mydev.set_sync_debug_mode("error")
        losses = [step() for _ in range(2)]
    finally:
        torch.mydev.set_sync_debug_mode("default")
    assert losses[1].item() < losses[0].item()


IDX = torch.tensor([3, 1, 7, 7])
IDX2 = torch.tensor([[3, 1, 0], [7, 7, 2]])
COLS = torch.tensor([5, 0, 2, 2])


@pytest.mark.parametrize("name,fn", [
    ("index_select", lambda x, i, i2, c: x.index_select(0, i)),
    ("x[i]", lambda x, i, i2, c: x[i]),
    ("x[i, j]", lambda x, i, i2, c: x[i, c]),
    ("gather", lambda x, i, i2, c: x.gather(0, i2)),
    ("take", lambda x, i, i2, c: x.take(i2)),
    ("scatter", lambda x, i, i2, c: x.scatter(0, i2, -1.0)),
    ("scatter_add", lambda x, i, i2, c: x.scatter_add(0, i2, x[:2, :3])),
    ("index_add", lambda x, i, i2, c: x.index_add(0, i, x[:4])),
    ("index_copy", lambda x, i, i2, c: x.index_copy(0, i[:2], x[:2])),
    ("index_fill", lambda x, i, i2, c: x.index_fill(1, c, 2.0)),
    ("index_put accumulate", lambda x, i, i2, c: x.index_put((i, c), x[0, :4], accumulate=True)),
    ("embedding", lambda x, i, i2, c: F.embedding(i2, x)),
    ("cross_entropy", lambda x, i, i2, c: F.cross_entropy(x[:4], c)),
    ("nll_loss, no reduction", lambda x, i, i2, c: F.nll_loss(x[:4].log_softmax(1), c, reduction="none")),
])
def test_indexing_gathers_scatters_and_class_losses_are_queued(name, fn):
    check_queued_like_cpu(fn, torch.randn(10, 6), IDX, IDX2, COLS)


@pytest.mark.parametrize("name,fn", [
    ("index_select", lambda x, bad: x.index_select(0, bad)),
    ("x[i]", lambda x, bad: x[bad]),
    ("gather", lambda x, bad: x.gather(0, bad)),
    ("scatter_", lambda x, bad: x.clone().scatter_(0, bad, 1.0)),
    ("embedding", lambda x, bad: F.embedding(bad, x.view(5, 1))),
    ("nll_loss", lambda x, bad: F.nll_loss(x.view(1, 5).expand(1, 5), bad)),
])
def test_an_index_out_of_range_in_a_queued_op_is_reported_at_the_next_sync(name, fn):
    # As CUDA reports a device-side assert: the call returns, the next
    # synchronisation raises, naming the op. Unlike CUDA the device stays usable.
    x = torch.arange(5.0, device="mydev")
    good, bad = torch.tensor([1]).to("mydev"), torch.tensor([7]).to("mydev")
    with pytest.raises((IndexError, RuntimeError), match="out of (bounds|range)|Target 7") as on_cpu:
        fn(x.cpu(), bad.cpu())                 # the CPU's own error
    for _ in range(2):                         # (index_reduce warns on its first call, which
        fn(x, good)                            # so does not confirm the signature)
    torch.mydev.synchronize()
    fn(x, bad)                                 # queued: no error yet
    with pytest.raises(on_cpu.type, match=r"a kernel failed on mydev:0: aten::\S+: .*(out of|Target 7)") as on_mydev:
        torch.mydev.synchronize()
    assert on_mydev.type is on_cpu.type        # the CPU's type (IndexError for most)
    torch.mydev.synchronize()                  # reported once
    torch.testing.assert_close(x.cpu(), torch.arange(5.0))
    torch.testing.assert_close(fn(x, good).cpu(), fn(x.cpu(), good.cpu()))


def test_arange_is_queued_and_shaped_by_its_exact_bounds():
    # (floating arguments are otherwise left out of the Meta cache's key)
    for end in (10.0, 1000.0, 10.5, 3.0):
        torch.arange(0.0, end, 0.5, device="mydev")   # (the signature's first call runs at the call)
        got, was_queued = queued(lambda: torch.arange(0.0, end, 0.5, device="mydev"))
        assert was_queued
        torch.testing.assert_close(got.cpu(), torch.arange(0.0, end, 0.5))


def test_copies_between_devices_are_ordered_with_both_streams():
    # As CUDA's: the copy waits for what the source's stream has queued (here a
    # kernel still held back), and the source's stream waits for the copy
    # before it may overwrite the source.
    x = torch.randn(1000)
    d0 = x.to("mydev:0")
    with delayed(torch.mydev.default_stream(0)):
        y = (d0 * 2).conj()                 # (a view the copy must first resolve, on mydev:0)
        z = y.to("mydev:1") + 1
    torch.testing.assert_close(z.cpu(), x * 2 + 1)
    with delayed(torch.mydev.default_stream(1)):
        copied = d0.to("mydev:1")           # queued on mydev:1, held back
        d0.fill_(5.0)                       # queued on mydev:0: must wait for the copy
    torch.testing.assert_close(copied.cpu(), x)
    torch.testing.assert_close(d0.cpu(), torch.full((1000,), 5.0))


# Ops outside the listed families are queued too once a call with the same
# dtypes ran at the call (their float kernels are not known in advance).
@pytest.mark.parametrize("name,fn", [
    ("digamma", torch.digamma),
    ("special.i1e", torch.special.i1e),
    ("special.zeta", lambda x: torch.special.zeta(x.abs() + 1, 2.0)),
    ("logaddexp", lambda x: torch.logaddexp(x, x * 2)),
    ("hardshrink", F.hardshrink),
    ("glu", lambda x: F.glu(x, -1)),
    ("pad, reflect", lambda x: F.pad(x, (2, 1), mode="reflect")),
    ("interpolate, bicubic", lambda x: F.interpolate(x.unsqueeze(0), scale_factor=2, mode="bicubic")),
    ("avg_pool3d", lambda x: F.avg_pool3d(x.unsqueeze(0), 2)),
    ("pixel_shuffle", lambda x: F.pixel_shuffle(x.reshape(1, 4, 6, 8), 2)),
    ("kthvalue", lambda x: torch.kthvalue(x, 3, -1)),
    ("median over a dim", lambda x: torch.median(x, 1)),
    ("cdist", lambda x: torch.cdist(x, x)),
    ("trace", lambda x: torch.trace(x[0])),
    ("histc", lambda x: torch.histc(x, 10, -2, 2)),
    ("linalg.solve_triangular", lambda x: torch.linalg.solve_triangular(
        x[0, :, :6].triu() + 6 * torch.eye(6, device=x.device), x[1, :, :6], upper=True)),
])
def test_ops_outside_the_listed_families_are_queued_after_their_first_call(name, fn):
    check_queued_like_cpu(fn, X)


@pytest.mark.parametrize("name,fn", [
    ("sum over a dim", lambda x: x.sum(1)),
    ("sum over all, keepdim", lambda x: x.sum((0, 1, 2), keepdim=True)),
    ("sum to float64", lambda x: x.sum(-1, dtype=torch.float64)),
    ("sum of int64", lambda x: torch.arange(24, device=x.device).view(4, 6).sum(0)),
    ("sum of an empty dim", lambda x: x[:, :0].sum(1)),
    ("clamp", lambda x: x.clamp(-0.5, 0.5)),
    ("clamp max only", lambda x: torch.clamp(x, max=0.1)),
    ("clamp_ min only", lambda x: x.clone().clamp_(min=-0.2)),
])
def test_sum_and_clamp_are_queued_structured_kernels(name, fn):
    check_queued_like_cpu(fn, X)


def test_calls_the_structured_kernels_leave_to_the_host_kernel_keep_cpu_results_and_errors():
    """clamp with NaN bounds (the CPU kernel fills the output with another op), of integer tensors or with
    bounds the dtype cannot hold (checked when the CPU loop runs), and sum of complex tensors take the host
    kernel: CPU's results and CPU's errors, at the call."""
    x = torch.randn(5, 3)
    d = x.to("mydev")
    torch.testing.assert_close(torch.complex(d, d).sum(0).cpu(), torch.complex(x, x).sum(0))
    torch.testing.assert_close(d.clamp(float("nan"), 1.0).cpu(), x.clamp(float("nan"), 1.0), equal_nan=True)
    i = torch.arange(10)
    assert torch.equal(i.to("mydev").clamp(2, 5).cpu(), i.clamp(2, 5))
    for bad in (lambda t: t.clamp(), lambda t: t.long().clamp_(0.5, 2.5), lambda t: t.half().clamp(max=1e5)):
        with pytest.raises(RuntimeError) as cpu_error:
            bad(x)
        with pytest.raises(RuntimeError) as dev_error:
            bad(d)
        assert str(dev_error.value) == str(cpu_error.value)
    torch.testing.assert_close(d.clamp(-1, 1).cpu(), x.clamp(-1, 1))  # the device still works


@pytest.mark.parametrize("name,fn", [
    ("float * bool mask", lambda x: x * (x > 0)),
    ("float / int64", lambda x: x / torch.arange(1, 9, device=x.device)),
    ("int64 * 0.5", lambda x: torch.arange(8, device=x.device) * 0.5),
    ("float add_ int64", lambda x: x.clone().add_(torch.arange(8, device=x.device))),
    ("int64 matrix product", lambda x: torch.arange(8, device=x.device).view(2, 4) @ torch.ones(4, 3, dtype=torch.long, device=x.device)),
    ("nanmean (sum / integer count)", lambda x: torch.nanmean(x, 1)),
])
def test_mixed_dtype_and_integer_calls_of_structured_ops_are_queued_after_their_first_call(name, fn):
    # add/sub/mul/div, mm and softmax run their own queued kernels for one
    # floating dtype; other calls go through the queued host kernel.
    check_queued_like_cpu(fn, X)


def test_an_op_outside_the_listed_families_rejects_an_unsupported_dtype_at_the_call():
    # Its first call with a dtype signature runs at the call, so a CPU kernel
    # without that dtype raises there (every time), not at a later sync.
    h = torch.randn(8).to("mydev")
    with pytest.raises(RuntimeError, match="not implemented for 'Float'"):
        torch.bitwise_and(h.cpu(), h.cpu())
    for _ in range(2):
        with delayed(torch.mydev.default_stream()):
            with pytest.raises(RuntimeError, match="not implemented for 'Float'"):
                torch.bitwise_and(h, h)
    torch.mydev.synchronize()  # nothing left to report
    torch.testing.assert_close((h * 2).cpu(), h.cpu() * 2)


def test_linear_algebra_that_checks_its_result_raises_at_the_call():
    # As CUDA's kernels read their LAPACK `info` on the host to raise here.
    singular = torch.zeros(3, 3, device="mydev")
    for _ in range(2):
        with delayed(torch.mydev.default_stream()):
            with pytest.raises(RuntimeError, match="singular|zero"):
                torch.linalg.inv(singular)
            with pytest.raises(RuntimeError, match="positive-definite"):
                torch.linalg.cholesky(-torch.eye(3, device="mydev"))
    torch.mydev.synchronize()  # nothing left to report


def test_products_into_out_are_queued_with_cpu_results_and_errors():
    a, b, bias = torch.randn(96, 64), torch.randn(64, 80), torch.randn(80)
    check_queued_like_cpu(lambda x, y: torch.mm(x, y, out=torch.empty(0, device=x.device)), a, b)
    check_queued_like_cpu(lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=2, out=torch.empty(0, device=x.device)),
                          bias, a, b)
    check_queued_like_cpu(lambda x, y: torch.mm(x, y, out=torch.empty(80, 96, device=x.device).t()), a, b)
    d, e = a.to("mydev"), b.to("mydev")
    with delayed(torch.mydev.default_stream()):
        with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float, but got double instead"):
            torch.mm(d, e, out=torch.empty(96, 80, dtype=torch.float64, device="mydev"))
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            torch.addmm(bias.to("mydev"), d, e, out=torch.empty(96, 80))
        for product in (lambda out: torch.mm(d, e, out=out), lambda out: torch.addmm(bias.to("mydev"), d, e, out=out)):
            with pytest.raises(RuntimeError, match="single memory location"):
                product(torch.empty(1, 80, device="mydev").expand(96, 80))
    torch.mydev.synchronize()  # nothing left to report
    # An out that is an operand: what the CPU's kernel makes of it.
    sq = torch.randn(64, 64)
    sq_cpu, sq_dev = sq.clone(), sq.to("mydev")
    torch.mm(sq_cpu, sq_cpu, out=sq_cpu)
    torch.mm(sq_dev, sq_dev, out=sq_dev)
    assert torch.equal(sq_dev.cpu(), sq_cpu)
    torch.testing.assert_close((d @ e).cpu(), a @ b)


def test_large_kernels_give_the_same_bits_on_one_compute_unit_or_two(python_subprocess):
    # A queued product, convolution, max pooling, attention or foreach kernel big enough runs in blocks (rows,
    # samples, a convolution's two gradients, a list's entries) shared by the device's compute units; its result
    # is the whole call's: the CPU's at one thread, and at two threads the same whichever units ran it.
    code = """
        import copy, hashlib, torch, my_device
        import torch.nn.functional as F
        digest = hashlib.sha256()
        for threads in (1, 2):
            torch.set_num_threads(threads)
            torch.manual_seed(0)
            got, want = [], []
            for m, k, n in [(512, 128, 384), (64, 512, 512), (100, 77, 333), (1000, 64, 130)]:
                a, b = torch.randn(m, k), torch.randn(k, n)
                bias, full, col = torch.randn(n), torch.randn(m, n), torch.randn(m, 1)
                A, B = a.to("mydev"), b.to("mydev")
                got += [A @ B, A @ B.t().contiguous().t(), A.t().contiguous().t() @ B,
                       torch.addmm(bias.to("mydev"), A, B), torch.addmm(full.to("mydev"), A, B, beta=0.5, alpha=2),
                       torch.addmm(col.to("mydev"), A, B), torch.mm(A, B, out=torch.empty(0, device="mydev")),
                       torch.addmm(bias.to("mydev"), A, B, out=torch.empty(n, m, device="mydev").t())]
                want += [a @ b, a @ b, a @ b, torch.addmm(bias, a, b), torch.addmm(full, a, b, beta=0.5, alpha=2),
                         torch.addmm(col, a, b), a @ b, torch.addmm(bias, a, b)]
                lin = torch.nn.Linear(k, n)
                x = torch.randn(m, k, requires_grad=True)
                lin_dev, x_dev = torch.nn.Linear(k, n).to("mydev"), x.detach().to("mydev").requires_grad_()
                lin_dev.load_state_dict(lin.state_dict())
                lin(x).square().sum().backward()
                lin_dev(x_dev).square().sum().backward()
                got += [x_dev.grad, lin_dev.weight.grad]
                want += [x.grad, lin.weight.grad]
            for conv, shape, channels_last in [(torch.nn.Conv2d(3, 16, 3, padding=1), (8, 3, 32, 32), False),
                                               (torch.nn.Conv2d(16, 32, 3, padding=1, groups=4), (8, 16, 16, 16), True),
                                               (torch.nn.ConvTranspose2d(16, 8, 3, stride=2), (8, 16, 16, 16), False),
                                               # (halves of these batches would take another algorithm than the
                                               # whole: they run whole)
                                               (torch.nn.Conv2d(64, 32, 1), (16, 64, 32, 32), False),
                                               (torch.nn.Conv2d(64, 64, 3, padding=1), (2, 64, 16, 16), False)]:
                net = torch.nn.Sequential(conv, torch.nn.ReLU(), torch.nn.MaxPool2d(2, ceil_mode=True))
                x = torch.randn(shape, requires_grad=True)
                if channels_last:
                    net, x = net.to(memory_format=torch.channels_last), x.detach().to(
                        memory_format=torch.channels_last).requires_grad_()
                net_dev = copy.deepcopy(net).to("mydev")
                x_dev = x.detach().to("mydev").requires_grad_()
                y = net(x)
                y.square().sum().backward()
                for _ in range(2):  # (a signature's first call runs at the call, whole; later ones are queued)
                    for t in [x_dev, *net_dev.parameters()]:
                        t.grad = None
                    y_dev = net_dev(x_dev)
                    y_dev.square().sum().backward()
                got += [y_dev, x_dev.grad, net_dev[0].weight.grad, net_dev[0].bias.grad]
                want += [y, x.grad, net[0].weight.grad, net[0].bias.grad]
            for shape, causal, mask in [((8, 4, 64, 32), True, None), ((8, 4, 64, 32), False, torch.randn(8, 1, 64, 64)),
                                        ((8, 4, 64, 32), False, torch.randn(1, 1, 64, 64)),
                                        ((64, 1, 64, 32), False, torch.randn(64, 64))]:  # (a 2-D mask: not cut)
                qkv = [torch.randn(shape, requires_grad=True) for _ in range(3)]
                qkv_dev = [t.detach().to("mydev").requires_grad_() for t in qkv]
                y = F.scaled_dot_product_attention(*qkv, attn_mask=mask, is_causal=causal)
                y.sum().backward()
                for _ in range(2):
                    for t in qkv_dev:
                        t.grad = None
                    y_dev = F.scaled_dot_product_attention(*qkv_dev, is_causal=causal,
                                                           attn_mask=None if mask is None else mask.to("mydev"))
                    y_dev.sum().backward()
                got += [y_dev] + [t.grad for t in qkv_dev]
                want += [y] + [t.grad for t in qkv]
            # an optimizer's foreach kernels over 0.5M parameters: two blocks of entries
            net = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Tanh(), torch.nn.Linear(512, 512))
            net_dev = copy.deepcopy(net).to("mydev")
            opts = [torch.optim.AdamW(n.parameters(), lr=0.01, foreach=True) for n in (net, net_dev)]
            x = torch.randn(16, 512)
            for _ in range(3):
                for n, opt, inp in zip((net, net_dev), opts, (x, x.to("mydev"))):
                    opt.zero_grad()
                    n(inp).square().mean().backward()
                    opt.step()
            got += list(net_dev.parameters())
            want += list(net.parameters())
            for i, (g, w) in enumerate(zip(got, want)):
                g = g.detach().cpu()
                if threads == 1:
                    assert torch.equal(g, w), (i, (g - w).abs().max().item())
                digest.update(g.contiguous().numpy().tobytes())
        print(digest.hexdigest(), my_device._C._test_blocks_run_by_other_units() > 0)
    """
    digests = []
    for units in ("1", "2"):
        result = python_subprocess(code, env={"MYDEV_COMPUTE_UNITS": units}, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        digest, shared = result.stdout.split()
        assert shared == ("True" if units == "2" else "False")  # (MYDEV_COMPUTE_UNITS=2: the helper always joins)
        digests.append(digest)
    assert digests[0] == digests[1]


def test_attention_backward_called_by_autograd_runs_in_blocks(python_subprocess):
    # Autograd hands the attention backward the forward's absent mask as an undefined tensor, not None: the call is
    # cut by samples all the same (it ran whole on one unit), with the CPU's bits.
    code = """
        import torch, my_device
        import torch.nn.functional as F
        torch.set_num_threads(1)
        torch.manual_seed(0)
        for causal in (True, False):
            qkv = [torch.randn(8, 4, 64, 32, requires_grad=True) for _ in range(3)]
            grad = torch.randn(8, 4, 64, 32)
            want = torch.autograd.grad(F.scaled_dot_product_attention(*qkv, is_causal=causal), qkv, grad)
            qkv_dev = [t.detach().to("mydev").requires_grad_() for t in qkv]
            out, grad_dev = F.scaled_dot_product_attention(*qkv_dev, is_causal=causal), grad.to("mydev")
            torch.autograd.grad(out, qkv_dev, grad_dev, retain_graph=True)  # (a signature's first call: whole)
            torch.mydev.synchronize()
            before = my_device._C._test_blocks_run_by_other_units()
            busy = torch.randn(64, 64, device="mydev")
            # (The other unit takes a block when it gets a core first: on a loaded machine that may take tries.)
            for _ in range(200):
                for _ in range(20):  # (queued ahead, too small to be cut: a backward run at the call is never cut)
                    busy @ busy
                got = torch.autograd.grad(out, qkv_dev, grad_dev, retain_graph=True)
                torch.mydev.synchronize()
                if my_device._C._test_blocks_run_by_other_units() > before:
                    break
            print(my_device._C._test_blocks_run_by_other_units() - before)
            for g, w in zip(got, want):
                assert torch.equal(g.cpu(), w), (causal, (g.cpu() - w).abs().max().item())
    """
    result = python_subprocess(code, env={"MYDEV_COMPUTE_UNITS": "2"}, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(int(n) > 0 for n in result.stdout.split()), result.stdout


def test_large_elementwise_kernels_run_in_blocks_with_the_cpus_bits(python_subprocess):
    # A queued elementwise TensorIterator kernel over two blocks' worth of elements runs as two narrowed copies of
    # its iterator on the device's compute units (gelu, which the CPU runs through oneDNN, as blocks of elements):
    # every unary and binary ufunc, functional and in place, over a contiguous input with a tail and over a
    # transposed one, gives the CPU's bits at one thread.
    code = """
        import torch, my_device
        from torch.testing._internal.common_methods_invocations import binary_ufuncs, unary_ufuncs
        torch.set_num_threads(1)
        torch.manual_seed(0)
        x, y = torch.randn(601, 509) * 2, torch.randn(601, 509) * 2 + 0.5
        inputs = [(x, y), (x.t(), y.t())]
        checked = set()
        for op in unary_ufuncs + binary_ufuncs:
            binary = op in binary_ufuncs
            for a, b in inputs:
                args = (a, b) if binary else (a,)
                for variant in (op.op, op.inplace_variant):
                    if variant is None:
                        continue
                    try:
                        want = variant(*[t.clone() for t in args])
                    except Exception:
                        continue  # (extra arguments, or no in-place form for these dtypes)
                    for _ in range(2):  # (a dtype's first call runs whole, at the call)
                        got = variant(*[t.to("mydev") for t in args])
                    for g, w in zip(*((r,) if isinstance(r, torch.Tensor) else r for r in (got, want))):
                        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, equal_nan=True,
                                                   msg=lambda m: f"{op.name} {variant}: {m}")
                    checked.add(op.name)
        # ternary ops and activations' backwards; gelu and its backward, which the CPU runs through oneDNN (the
        # host kernel's blocks of elements)
        for name, fn in (("gelu", lambda t, g: torch.nn.functional.gelu(t)),
                         ("gelu_backward", lambda t, g: torch.ops.aten.gelu_backward(g, t)),
                         ("addcmul", lambda t, g: torch.addcmul(t, g, t, value=0.3)),
                         ("addcdiv_", lambda t, g: t.clone().addcdiv_(g, t.abs() + 1, value=0.3)),
                         ("lerp", lambda t, g: torch.lerp(t, g, t.sigmoid())),
                         ("clamp", lambda t, g: torch.clamp(t, min=-g.abs(), max=g.abs())),
                         ("where", lambda t, g: torch.where(t > 0, t, g)),
                         ("threshold_backward", lambda t, g: torch.ops.aten.threshold_backward(g, t, 0.0)),
                         ("tanh_backward", lambda t, g: torch.ops.aten.tanh_backward(g, t.tanh()))):
            want = fn(x, y)
            for _ in range(2):
                got = fn(x.to("mydev"), y.to("mydev"))
            torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
        print(len(checked), my_device._C._test_blocks_run_by_other_units() > 0)
    """
    result = python_subprocess(code, env={"MYDEV_COMPUTE_UNITS": ""}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    checked, shared = result.stdout.split()[-2:]
    assert int(checked) > 100 and shared == "True", result.stdout


@pytest.mark.parametrize("name,fn", [
    ("put", lambda x, i: x.put(i, torch.ones(1, device=x.device))),
    ("index_reduce", lambda x, i: x.index_reduce(0, i, torch.ones(1, device=x.device), "prod")),
])
def test_a_value_error_in_other_queued_ops_is_reported_at_the_next_sync(name, fn):
    x = torch.arange(5.0, device="mydev")
    good, bad = torch.tensor([1]).to("mydev"), torch.tensor([7]).to("mydev")
    for _ in range(2):                         # (index_reduce warns on its first call, which
        fn(x, good)                            # so does not confirm the signature)
    torch.mydev.synchronize()
    fn(x, bad)                                 # queued: no error yet
    with pytest.raises(IndexError, match=r"a kernel failed on mydev:0: aten::\S+: .*out of range"):
        torch.mydev.synchronize()
    torch.testing.assert_close(fn(x, good).cpu(), fn(x.cpu(), good.cpu()))


def test_an_op_whose_cpu_kernel_lays_out_its_output_unlike_meta_is_not_queued_with_a_wrong_layout():
    # max_unpool2d's CPU kernel gives a channels-last input a channels-last
    # output; its Meta kernel says contiguous. A queued call would hand out the
    # Meta layout and the CPU out= kernel would then restride it on the worker
    # (a kernel failure at the next sync). The first run at the call of a new
    # dtype and layout signature shows the difference, and the op stays at the call.
    x = torch.randn(1, 2, 3, 3)
    pooled, idx = F.max_pool2d(x, 2, stride=1, return_indices=True)
    for layout in (torch.contiguous_format, torch.channels_last, torch.contiguous_format):
        p = pooled.contiguous(memory_format=layout)
        for _ in range(2):
            got = F.max_unpool2d(p.to("mydev"), idx.to("mydev"), 2, stride=1)
            torch.mydev.synchronize()              # no kernel failed
            torch.testing.assert_close(got.cpu(), F.max_unpool2d(p, idx, 2, stride=1))


def test_an_op_whose_meta_kernel_disagrees_with_the_cpu_by_mode_stays_at_the_call():
    # embedding_bag's Meta kernel sizes its bookkeeping outputs differently
    # from the CPU kernel depending on the mode, which a first run cannot show
    # for every mode: it is never queued, so an index out of range is raised
    # at the call.
    weight = torch.randn(5, 3, device="mydev")
    offsets = torch.tensor([0], device="mydev")
    good, bad = torch.tensor([1, 2]).to("mydev"), torch.tensor([1, 9]).to("mydev")
    for mode in ("mean", "sum", "max", "mean"):
        torch.testing.assert_close(F.embedding_bag(good, weight, offsets, mode=mode).cpu(),
                                   F.embedding_bag(good.cpu(), weight.cpu(), offsets.cpu(), mode=mode))
    with delayed(torch.mydev.default_stream()):
        with pytest.raises(RuntimeError, match="not in the valid range"):
            F.embedding_bag(bad, weight, offsets)
    torch.mydev.synchronize()  # nothing left to report


def _lists(device, n=3):
    g = torch.Generator().manual_seed(7)
    return [[torch.randn(4, 5, generator=g).to(device) for _ in range(n)] for _ in range(3)]


# In-place foreach ops of the host kernel. (The optimizers' ones have kernels
# of their own, one queued kernel per call too: test_foreach.py.)
FOREACH = {
    "exp_": lambda a, b, c: torch._foreach_exp_(a),
    "clamp_min_": lambda a, b, c: torch._foreach_clamp_min_(a, b),
    "addcmul_ of mixed dtypes": lambda a, b, c: torch._foreach_addcmul_(a, b, [t.double() for t in c], value=0.5),
    "sub_ scalar list": lambda a, b, c: torch._foreach_sub_(a, [0.5, 2.0, -1.0]),
    "sqrt_ of abs": lambda a, b, c: (torch._foreach_abs_(a), torch._foreach_sqrt_(a)),
}


@pytest.mark.parametrize("name", list(FOREACH))
def test_in_place_foreach_ops_are_one_queued_kernel_per_call(name):
    want = _lists("cpu")
    FOREACH[name](*want)
    got = _lists("mydev")
    FOREACH[name](*_lists("mydev"))            # (the signature's first call runs at the call)
    torch.mydev.synchronize()
    my_device._C._host_kernel_breakdown(True)
    _, was_queued = queued(FOREACH[name], *got)
    counts = dict(my_device._C._host_kernel_breakdown(False))
    assert was_queued
    # One host-kernel call per foreach op (sqrt_ has its own kernel), whatever the list length.
    assert counts["queued"] == 1 and counts["inline"] == 0
    for g, w in zip(got[0], want[0]):
        torch.testing.assert_close(g.cpu(), w)


def test_foreach_errors_come_at_the_call_and_lose_nothing():
    a, b, _ = _lists("mydev")
    before = [t.cpu() for t in a]
    with pytest.raises(RuntimeError, match="same number of tensors|size of tensor"):
        torch._foreach_add_(a, b[:2])
    with pytest.raises(RuntimeError, match="size of tensor a"):
        torch._foreach_add_(a, [torch.randn(3, 3, device="mydev")] * 3)
    for t, w in zip(a, before):
        torch.testing.assert_close(t.cpu(), w)
    torch._foreach_add_(a, b)
    torch.testing.assert_close(a[0].cpu(), before[0] + b[0].cpu())


@pytest.mark.parametrize("name,fn", [
    ("zero_", lambda x: x.zero_()),
    ("fill_ 0", lambda x: x.fill_(0)),
    ("zeros_like", torch.zeros_like),
    ("zero_ of a permuted view", lambda x: x.permute(2, 0, 1).zero_()),
])
def test_zeroing_dense_tensors_is_a_queued_memset(name, fn):
    d = X.to("mydev").clone()
    r, was_queued = queued(fn, d)
    assert was_queued
    torch.testing.assert_close(r.cpu(), fn(X.clone()))
    assert not torch.signbit(r.cpu()).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.half, torch.int64, torch.bool,
                                   torch.complex64])
def test_short_zeroing_on_an_idle_stream_runs_at_the_call(dtype):
    # A short dense zero fill is a memset run at the call (Fill.cpp: memset_zero), as is one nested
    # in a kernel run at the call (the CPU's sum zeroes its output): all bits zero, the stream idle.
    x = torch.full((4, 6, 8), -1, dtype=dtype) if dtype is not torch.bool else torch.ones(4, 6, 8, dtype=dtype)
    if dtype.is_floating_point:
        x = x * -0.0 - 1  # no -0.0 survives a memset
    s = torch.mydev.default_stream()
    for fn in (lambda t: t.zero_(), lambda t: t.fill_(0), torch.zeros_like, lambda t: t.permute(2, 0, 1).zero_()):
        d = x.to("mydev")
        torch.mydev.synchronize()
        (got, idle), calls = host_kernel_calls(lambda: (fn(d), s.query()))
        assert idle and calls == 0
        expected = fn(x.clone())
        assert torch.equal(got.cpu(), expected) and not torch.signbit(got.cpu().real.float()).any()
    if dtype in (torch.float32, torch.float64):
        small = torch.randn(3, 5, dtype=dtype)
        torch.testing.assert_close(small.to("mydev").sum(1).cpu(), small.sum(1))


def test_zeroing_other_tensors_and_other_fills_keep_cpu_results():
    d, x = X.to("mydev").clone(), X.clone()
    for fn in (lambda t: t[:, ::2].zero_(), lambda t: t.fill_(-0.0), lambda t: t.fill_(2.5),
               lambda t: t.expand(3, *t.shape)[0].zero_()):
        torch.testing.assert_close(fn(d).cpu(), fn(x))
        torch.testing.assert_close(d.cpu(), x)
    assert torch.signbit(d.fill_(-0.0).cpu()).all()
    # Overlapping memory (an expanded view) is no memset's business, and no error on CPU either.
    ones = torch.ones(3, device="mydev")
    ones.expand(2, 3).zero_()
    torch.testing.assert_close(ones.cpu(), torch.zeros(3))
    torch.testing.assert_close(d.add(1).cpu(), x.add(1))


@pytest.mark.parametrize("value", [0, 1, 2 ** 63, 2 ** 64 - 1])
def test_unsigned_64_bit_fills_take_every_value_the_cpu_takes(value):
    """uint64 values past int64's range fill as on the CPU (test_ops.py's out= tests fill with the maximum)."""
    for make in (lambda d: torch.zeros(5, dtype=torch.uint64, device=d).fill_(value),
                 lambda d: torch.full_like(torch.zeros(5, dtype=torch.uint64, device=d), value),
                 lambda d: torch.full((2, 3), value, dtype=torch.uint64, device=d)):
        assert torch.equal(make("mydev").cpu(), make("cpu"))


FILLS = {
    "fill_": lambda t, v: t.fill_(v),
    "fill_ strided": lambda t, v: t[:, ::2].fill_(v),
    "fill_ of a column": lambda t, v: t.t()[1].fill_(v),
    "fill_ of an expanded view": lambda t, v: t[0].expand(3, 6).fill_(v),
    "ones_like": lambda t, v: torch.ones_like(t),
    "full_like": lambda t, v: torch.full_like(t, v),
    "zero_ strided": lambda t, v: t[:, 1::3].zero_(),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                                   torch.int64, torch.bool, torch.complex64], ids=str)
@pytest.mark.parametrize("name", list(FILLS))
def test_short_fills_on_an_idle_stream_run_at_the_call(name, dtype):
    # A fill other than a dense zero memset (ones_like, full, backward()'s seed gradient, a view's
    # zero_) runs the CPU's fill loop at the call on an idle stream (Fill.cpp: fill_at_call): no
    # host kernel, and the stream is as idle after it as before, so the ops after it run at the
    # call too.
    value = True if dtype is torch.bool else (1.5 - 2j if dtype.is_complex else 3)
    x = (torch.arange(24).reshape(4, 6) % 5).to(dtype)
    d = x.to("mydev")
    s = torch.mydev.current_stream()

    def call():
        out = FILLS[name](d, value)
        return out, s.query()

    (got, idle), calls = host_kernel_calls(call)
    assert idle and calls == 0
    expected = FILLS[name](x, value)
    assert got.dtype == expected.dtype and got.stride() == expected.stride()
    assert torch.equal(got.cpu(), expected) and torch.equal(d.cpu(), x)


def test_a_fill_at_the_call_that_does_not_fit_raises_there_and_loses_nothing():
    # As the CPU: the value is converted before anything is written, and the error comes at the
    # call, not at the next synchronisation (the queued path checks it the same way, above).
    i8 = torch.arange(6, dtype=torch.int8, device="mydev")
    torch.mydev.synchronize()
    for view in (i8, i8[::2], i8[:0]):
        with pytest.raises(RuntimeError, match="cannot be converted to type int8_t without overflow"):
            view.fill_(1000)
    torch.mydev.synchronize()  # nothing left to report
    assert i8.cpu().tolist() == list(range(6))
    assert i8[::2].fill_(-7).cpu().tolist() == [-7] * 3


def test_a_python_float_that_changes_at_every_call_does_not_keep_a_call_at_the_call():
    # bfloat16 * number takes the host kernel (its loop computes in float); a
    # learning rate that changes every step must not make each step's call a new
    # signature, run at the call. Its value still counts for the results.
    x = torch.randn(64).to(torch.bfloat16)
    d = x.to("mydev")
    d * 0.5                                    # (the signature's first call runs at the call)
    for lr in (0.25, 0.125, 3e-4):
        got, was_queued = queued(lambda: d * lr)
        assert was_queued, lr
        assert torch.equal(got.cpu(), x * lr)
    got, was_queued = queued(lambda: d * float("nan"))   # another class of value: a new signature
    assert not was_queued and torch.equal(got.cpu().isnan(), (x * float("nan")).isnan())


CAT_ARGMAX = [
    ("cat along a middle dim", lambda x: torch.cat([x, x[:, :2] * 2], 1)),
    ("cat of a transposed and a contiguous input", lambda x: torch.cat([x.transpose(0, 1), x[:1].reshape(6, 1, 8)], 1)),
    ("cat promoting float and int64", lambda x: torch.cat([x[0], (x[1] * 10).long()])),
    ("cat skipping a legacy empty input", lambda x: torch.cat([torch.empty(0, device=x.device), x, x], 2)),
    ("cat of one tensor twice, channels_last", lambda x: torch.cat([x.unsqueeze(0).to(
        memory_format=torch.channels_last)] * 2, 1)),
    ("argmax over a dim", lambda x: x.argmax(1)),
    ("argmax of everything", lambda x: x.argmax()),
    ("argmax keepdim, int64", lambda x: (x * 10).long().argmax(-1, keepdim=True)),
    ("argmin over a dim", lambda x: torch.argmin(x, 0)),
    ("argmax over a dim of size 1", lambda x: x[:, :1].argmax(1)),
]


@pytest.mark.parametrize("name,fn", CAT_ARGMAX)
def test_cat_argmax_and_argmin_are_queued_kernels_of_their_own(name, fn):
    """A decoder's step: a cat a layer for its key/value cache, an argmax for the next token. Each takes
    its structured CPU kernel, queued (not the generic host kernel), with CPU's results."""
    check_queued_like_cpu(fn, X)
    d = X.to("mydev")
    got, host_calls = host_kernel_calls(lambda: fn(d))
    assert host_calls == 0
    assert torch.equal(got.cpu(), fn(X))


def test_cat_and_argmax_errors_come_at_the_call_as_on_the_cpu_and_lose_nothing():
    x = torch.randn(3, 4)
    d = x.to("mydev")
    bad_calls = [
        lambda t: torch.cat([t, t[:, :2]], 0),  # sizes differ outside the dim
        lambda t: torch.cat([t, t], 2),  # dim out of range
        lambda t: torch.cat([t, t.view(12)]),  # ranks differ
        lambda t: torch.cat([t.sum(), t.sum()]),  # zero-dim inputs
        lambda t: t[:0].argmax(),  # nothing to reduce
        lambda t: t[:, :0].argmin(1),
        lambda t: torch.complex(t, t).argmax(),
        lambda t: (t > 0).argmax(0),
        lambda t: t.argmax(5),
    ]
    for bad in bad_calls:
        with pytest.raises(Exception) as cpu_error:
            bad(x)
        with pytest.raises(Exception) as dev_error:
            bad(d)
        torch.mydev.synchronize()
        assert type(dev_error.value) is type(cpu_error.value)
        assert str(dev_error.value) == str(cpu_error.value)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.cat([d, x])
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.cat([x, d])
    assert torch.equal(torch.cat([d, d]).cpu(), torch.cat([x, x]))
    assert torch.equal(d.argmax(1).cpu(), x.argmax(1))
