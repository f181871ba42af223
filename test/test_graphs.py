"""Device graphs: torch.mydev.MyDevGraph / graph / make_graphed_callables / MemPool, against eager."""
import copy
import gc
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import my_device  # noqa: F401

DEV = "mydev"


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def _warm_up(fn, iters=3):
    """Runs fn on a side stream a few times, as CUDA graphs require before capture (lazy state, first-call
    checks)."""
    s = torch.mydev.Stream()
    s.wait_stream(torch.mydev.current_stream())
    with torch.mydev.stream(s):
        for _ in range(iters):
            fn()
    torch.mydev.current_stream().wait_stream(s)
    torch.mydev.synchronize()


def _train_with_graph(model, forward, steps=5, warm=3):
    """Trains `model` (on mydev, run through `forward`) with a capturable AdamW, the step captured in a graph
    after `warm` warm-up steps, and the same model on the CPU eagerly on the same data; returns the losses of
    both (one per step after warm-up) and the two models."""
    ref = _model()
    ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)
    static_x = torch.zeros(4, 16, device=DEV)
    static_y = torch.zeros(4, 4, device=DEV)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = nn.functional.mse_loss(forward(static_x), static_y)
        loss.backward()
        opt.step()
        return loss

    def ref_step(x, y):
        ref_opt.zero_grad(set_to_none=False)
        loss = nn.functional.mse_loss(ref(x), y)
        loss.backward()
        ref_opt.step()
        return loss.detach()

    batches = iter([(torch.randn(4, 16), torch.randn(4, 4)) for _ in range(warm)])

    def warm_step():
        x, y = next(batches)
        static_x.copy_(x)
        static_y.copy_(y)
        step()
        ref_step(x, y)

    _warm_up(warm_step, iters=warm)
    g = torch.mydev.MyDevGraph()
    with torch.mydev.graph(g):
        static_loss = step()
    losses = []
    for _ in range(steps):
        x, y = torch.randn(4, 16), torch.randn(4, 4)
        static_x.copy_(x)
        static_y.copy_(y)
        g.replay()
        losses.append((static_loss.cpu(), ref_step(x, y)))
    return losses, ref


def test_training_step_replayed_equals_eager():
    """Forward, backward and a capturable AdamW step captured once, replayed with new data copied into the
    static inputs: five steps equal five eager steps on the CPU."""
    model = _model().to(DEV)
    losses, ref = _train_with_graph(model, model)
    for got, expected in losses:
        torch.testing.assert_close(got, expected)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def test_mydev_compiled_step_captured_with_optimizer():
    """torch.compile(backend="mydev")'s programs capture with the optimizer step around them."""
    model = _model(3).to(DEV)
    compiled = torch.compile(model, backend="mydev")
    losses, ref = _train_with_graph(model, compiled)
    for got, expected in losses:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


@pytest.mark.parametrize("optimizer", ["Adam", "SGD"])
def test_capturable_optimizer_step(optimizer):
    params = [torch.randn(8, 8) for _ in range(3)]
    grads = [torch.randn(8, 8) for _ in range(3)]
    kwargs = {"lr": 0.1, "momentum": 0.9} if optimizer == "SGD" else {"lr": 0.1}
    ref = [p.clone().requires_grad_() for p in params]
    dev = [p.to(DEV).requires_grad_() for p in params]
    for p, g in zip(ref, grads):
        p.grad = g.clone()
    for p, g in zip(dev, grads):
        p.grad = g.to(DEV)
    ref_opt = getattr(torch.optim, optimizer)(ref, **kwargs)
    opt = getattr(torch.optim, optimizer)(dev, **kwargs, **({"capturable": True} if optimizer == "Adam" else {}))
    _warm_up(opt.step, iters=1)
    ref_opt.step()
    g = torch.mydev.MyDevGraph()
    with torch.mydev.graph(g):
        opt.step()
    for _ in range(3):
        g.replay()
        ref_opt.step()
    for p, q in zip(dev, ref):
        torch.testing.assert_close(p.detach().cpu(), q.detach())


def test_dropout_draws_eager_numbers_at_each_replay():
    x = torch.ones(64, 64, device=DEV)
    torch.mydev.manual_seed(123)
    eager = [nn.functional.dropout(x, 0.5).cpu() for _ in range(3)]
    eager_randn = torch.randn(5, device=DEV).cpu()

    _warm_up(lambda: nn.functional.dropout(x, 0.5))
    g = torch.mydev.MyDevGraph()
    with torch.mydev.graph(g):
        out = nn.functional.dropout(x, 0.5)
    torch.mydev.manual_seed(123)
    for expected in eager:
        g.replay()
        torch.testing.assert_close(out.cpu(), expected)
    # The replays advanced the generator as the eager calls did.
    torch.testing.assert_close(torch.randn(5, device=DEV).cpu(), eager_randn)
    assert not torch.equal(eager[0], eager[1])


def test_randn_in_graph_with_own_generator():
    gen = torch.Generator(device=DEV)
    gen.manual_seed(7)
    eager = [torch.randn(10, device=DEV, generator=gen).cpu() for _ in range(2)]
    _warm_up(lambda: torch.randn(10, device=DEV, generator=gen))
    gen.manual_seed(7)
    g = torch.mydev.MyDevGraph()
    with torch.mydev.graph(g):
        out = torch.randn(10, device=DEV, generator=gen)
    assert gen.get_offset() == 0  # capturing draws nothing
    for expected in eager:
        g.replay()
        torch.testing.assert_close(out.cpu(), expected)
    assert gen.get_offset() == 2


@pytest.mark.parametrize("what", ["item", "cpu", "synchronize", "nonzero", "print"])
def test_waiting_during_capture_raises_and_leaves_device_usable(what):
    x = torch.arange(6.0, device=DEV)
    before = x * 2
    _warm_up(lambda: x + 1)
    g = torch.mydev.MyDevGraph()
    actions = {
        "item": lambda: x.sum().item(),
        "cpu": lambda: x.cpu(),
        "synchronize": torch.mydev.synchronize,
        "nonzero": lambda: torch.nonzero(x),
        "print": lambda: repr(x),
    }
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
        with torch.mydev.graph(g):
            y = x + 1
            actions[what]()
    assert not torch.mydev.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    # The device, and its tensors, still work; a new capture works.
    torch.testing.assert_close(before.cpu(), torch.arange(6.0) * 2)
    torch.testing.assert_close((x + 1).cpu(), torch.arange(6.0) + 1)
    g2 = torch.mydev.MyDevGraph()
    with torch.mydev.graph(g2):
        y = x + 1
    g2.replay()
    torch.testing.assert_close(y.cpu(), torch.arange(6.0) + 1)


def test_capture_on_default_stream_refused():
    g = torch.mydev.MyDevGraph()
    with pytest.raises(RuntimeError, match="must be captured on a non-default stream"):
        g.capture_begin()
    assert not torch.mydev.is_current_stream_capturing()


def test_is_current_stream_capturing():
    x = torch.ones(3, device=DEV)
    _warm_up(lambda: x * 2)
    seen = []
    g = torch.mydev.MyDevGraph()
    with torch.mydev.graph(g):
        seen.append(torch.mydev.is_current_stream_capturing())
        y = x * 2
    assert seen == [True] and not torch.mydev.is_current_stream_capturing()
    g.replay()
    torch.testing.assert_close(y.cpu(), torch.full((3,), 2.0))


def test_make_graphed_callables_module_with_autograd():
    """Graphed forward and backward equal eager's, step after step. (Each step starts with no .grad, as in
    training: the first gradient accumulated into an empty .grad is the graph's static buffer itself, as on
    CUDA, so gradients are not summed over replays.)"""
    ref = _model(1)
    model = _model(1).to(DEV)
    x = torch.randn(4, 16, requires_grad=True)
    graphed = torch.mydev.make_graphed_callables(model, (x.to(DEV).detach().requires_grad_(),))
    for step in range(3):
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        inp = torch.randn(4, 16)
        a = inp.to(DEV).requires_grad_()
        b = inp.clone().requires_grad_()
        out = graphed(a)
        expected = ref(b)
        torch.testing.assert_close(out.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-6)
        (out * out).sum().backward()
        (expected * expected).sum().backward()
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-5, atol=1e-6)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)


def test_make_graphed_callables_function():
    def fn(a, b):
        return (a * b).sin() + a

    a = torch.randn(8, device=DEV, requires_grad=True)
    b = torch.randn(8, device=DEV, requires_grad=True)
    graphed = torch.mydev.make_graphed_callables(fn, (a, b))
    a2, b2 = torch.randn(8), torch.randn(8)
    ga, gb = a2.to(DEV).requires_grad_(), b2.to(DEV).requires_grad_()
    ca, cb = a2.clone().requires_grad_(), b2.clone().requires_grad_()
    graphed(ga, gb).sum().backward()
    fn(ca, cb).sum().backward()
    torch.testing.assert_close(ga.grad.cpu(), ca.grad)
    torch.testing.assert_close(gb.grad.cpu(), cb.grad)


def test_make_graphed_callables_is_still_cuda_only_in_pytorch():
    """torch.mydev.make_graphed_callables runs torch.cuda's with torch.cuda's names bound to torch.mydev's
    (graphs.py): a device-generic version in PyTorch would replace that."""
    assert not hasattr(torch.accelerator, "make_graphed_callables")


def _two_streams():
    """Two different side streams (torch.mydev.Stream() hands out a pool's streams in turn, as
    torch.cuda.Stream() does: two calls may return the same one after the pool wrapped)."""
    a = torch.mydev.Stream()
    b = torch.mydev.Stream()
    while b == a:
        b = torch.mydev.Stream()
    return a, b


def test_multi_stream_capture():
    x = torch.randn(32, device=DEV)
    _warm_up(lambda: (x.sin(), x.cos()))
    capture, side = _two_streams()
    g = torch.mydev.MyDevGraph()
    with torch.mydev.graph(g, stream=capture):
        a = x * 2
        side.wait_stream(torch.mydev.current_stream())
        with torch.mydev.stream(side):
            b = a.sin()
        c = a.cos()
        torch.mydev.current_stream().wait_stream(side)
        out = b + c
    x.copy_(torch.linspace(0, 1, 32))
    g.replay()
    ref = torch.linspace(0, 1, 32) * 2
    torch.testing.assert_close(out.cpu(), ref.sin() + ref.cos())


def test_unjoined_side_stream_fails_capture():
    x = torch.randn(32, device=DEV)
    _warm_up(lambda: x.sin())
    capture, side = _two_streams()
    g = torch.mydev.MyDevGraph()
    with pytest.raises(RuntimeError, match="not joined back"):
        with torch.mydev.graph(g, stream=capture):
            side.wait_stream(torch.mydev.current_stream())
            with torch.mydev.stream(side):
                x.sin()
    torch.testing.assert_close(x.sin().cpu(), x.cpu().sin())


def test_shared_pool_and_no_leak_after_reset():
    torch.mydev.synchronize()
    torch.mydev.empty_cache()
    base = torch.mydev.memory_reserved()
    x = torch.randn(256, 256, device=DEV)
    _warm_up(lambda: (x @ x).relu())
    torch.mydev.empty_cache()
    base = torch.mydev.memory_reserved()
    pool = torch.mydev.graph_pool_handle()
    g1, g2 = torch.mydev.MyDevGraph(), torch.mydev.MyDevGraph()
    with torch.mydev.graph(g1, pool=pool):
        y1 = (x @ x).relu()
    with torch.mydev.graph(g2, pool=g1.pool()):
        y2 = (y1 @ x).relu()
    assert g1.pool() == g2.pool() == pool
    assert torch.mydev.memory_reserved() > base
    x.copy_(torch.eye(256))
    g1.replay()
    g2.replay()
    torch.testing.assert_close(y2.cpu(), torch.eye(256))
    torch.mydev.empty_cache()  # the pool's memory is kept for the replays
    g1.replay()
    torch.testing.assert_close(y1.cpu(), torch.eye(256))
    del y1, y2
    g1.reset()
    assert torch.mydev.memory_reserved() > base  # still g2's
    g2.reset()
    torch.mydev.empty_cache()
    assert torch.mydev.memory_reserved() == base


def test_accelerator_graph():
    x = torch.ones(4, device=DEV)
    _warm_up(lambda: x.add_(1))
    x.fill_(1)
    s = torch.Stream(DEV)
    g = torch.accelerator.Graph()
    with s, g:
        x.add_(1)
    torch.testing.assert_close(x.cpu(), torch.ones(4))  # captured, not run
    g.replay()
    g.replay()
    torch.testing.assert_close(x.cpu(), torch.full((4,), 3.0))


def test_debug_dump(tmp_path):
    x = torch.ones(4, device=DEV)
    _warm_up(lambda: (x + 1) * 2)
    g = torch.mydev.MyDevGraph()
    g.enable_debug_mode()
    with torch.mydev.graph(g):
        y = (x + 1) * 2
    path = tmp_path / "graph.dot"
    g.debug_dump(str(path))
    text = path.read_text()
    assert text.startswith("digraph") and "aten::add" in text and "aten::mul" in text and "->" in text
    g.replay()
    torch.testing.assert_close(y.cpu(), torch.full((4,), 4.0))


def test_kernel_failure_in_replay_reported_at_sync_naming_op():
    x = torch.ones(4, device=DEV)
    _warm_up(lambda: x.exp())
    g = torch.mydev.MyDevGraph()
    with torch.mydev.graph(g):
        y = x.exp()
    my_device._C._test_inject_kernel_failure("aten::exp")
    g.replay()
    with pytest.raises(RuntimeError, match="aten::exp"):
        torch.mydev.synchronize()
    g.replay()
    torch.testing.assert_close(y.cpu(), torch.full((4,), 2.718281828))


def test_mem_pool():
    torch.mydev.synchronize()
    torch.mydev.empty_cache()
    base = torch.mydev.memory_reserved()
    pool = torch.mydev.MemPool()
    assert pool.use_count() == 1
    with torch.mydev.use_mem_pool(pool):
        a = torch.randn(1024, 1024, device=DEV)
    b = torch.randn(1024, 1024, device=DEV)
    reserved = torch.mydev.memory_reserved()
    del b
    torch.mydev.empty_cache()
    assert torch.mydev.memory_reserved() < reserved  # b's memory was not the pool's
    kept = torch.mydev.memory_reserved()
    del a
    torch.mydev.empty_cache()
    assert torch.mydev.memory_reserved() == kept  # the pool keeps its memory
    del pool
    torch.mydev.empty_cache()
    assert torch.mydev.memory_reserved() == base


_PARALLEL_REPLAY_SCRIPT = """
import copy, sys, torch
from torch import nn
import my_device  # noqa: F401
torch.manual_seed(0)
model = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.1, batch_first=True).to("mydev")
eager_model = copy.deepcopy(model)
data = [(torch.randn(4, 8, 32), torch.randn(4, 8, 32)) for _ in range(6)]
x, y = torch.zeros(4, 8, 32, device="mydev"), torch.zeros(4, 8, 32, device="mydev")

def trainer(m):
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, capturable=True)
    def step():
        opt.zero_grad(set_to_none=False)
        loss = nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        return loss
    return step

step, eager_step = trainer(model), trainer(eager_model)
side = torch.mydev.Stream()
side.wait_stream(torch.mydev.current_stream())
torch.manual_seed(2)
with torch.mydev.stream(side):
    for _ in range(3):
        x.copy_(data[0][0]); y.copy_(data[0][1]); step()
torch.mydev.current_stream().wait_stream(side)
torch.mydev.synchronize()  # (as _warm_up: the warm-up's first calls have run before the capture)
g = torch.mydev.MyDevGraph()
with torch.mydev.graph(g):
    static_loss = step()
torch.manual_seed(1)
losses = []
for a, b in data[1:]:
    x.copy_(a); y.copy_(b); g.replay(); losses.append(static_loss.item())
torch.manual_seed(2)
for _ in range(3):  # (the warm-up steps the graph's model took)
    x.copy_(data[0][0]); y.copy_(data[0][1]); eager_step()
torch.manual_seed(1)
eager = []
for a, b in data[1:]:
    x.copy_(a); y.copy_(b); eager.append(eager_step().item())
torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager))
for p, q in zip(model.parameters(), eager_model.parameters()):
    torch.testing.assert_close(p.cpu(), q.cpu())
torch.save([p.detach().cpu() for p in model.parameters()] + [torch.tensor(losses)], sys.argv[1])
"""


def test_parallel_replay_gives_the_serial_replays_bits(tmp_path):
    """A replay runs kernels whose declared memory is disjoint on two threads (MYDEV_COMPUTE_UNITS):
    a transformer layer's training step (dropout, attention, AdamW) replayed that way gives, bit for bit,
    the parameters and losses of replays in capture order, and both equal eager's."""
    results = []
    for threads in ("1", "2"):
        out = tmp_path / f"threads{threads}.pt"
        done = subprocess.run([sys.executable, "-c", _PARALLEL_REPLAY_SCRIPT, str(out)], capture_output=True,
                              text=True, timeout=300, env=dict(os.environ, MYDEV_COMPUTE_UNITS=threads))
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(torch.load(out))
    for serial, parallel in zip(*results):
        assert torch.equal(serial, parallel)


@pytest.mark.slow
def test_graphs_under_strict_mode():
    """The capture, replay and error tests again with MYDEV_STRICT=1 (device memory unreadable by host code)."""
    env = dict(os.environ, MYDEV_STRICT="1")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__, "-k", "not strict_mode"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


# torch.compile(mode="reduce-overhead") replays graphs through Inductor's cudagraph trees (torch's default,
# inductor/graph_trees.py) or, with torch._inductor.config.triton.cudagraph_trees = False, through its
# non-tree wrapper (inductor/graphs.py). The trees warm up on a graph's first call and record on its second;
# the wrapper records on the first.
TREES = pytest.mark.parametrize("trees", [True, False], ids=["trees", "no_trees"])


@pytest.fixture
def replays(monkeypatch):
    replayed = []
    replay = torch.mydev.MyDevGraph.replay
    monkeypatch.setattr(torch.mydev.MyDevGraph, "replay", lambda self: (replayed.append(self), replay(self))[1])
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield replayed
    torch._dynamo.reset()


def _with_trees(request, trees):
    patch = torch._inductor.config.patch({"triton.cudagraph_trees": trees})
    patch.__enter__()
    request.addfinalizer(lambda: patch.__exit__(None, None, None))


@TREES
def test_compile_reduce_overhead_replays_mydev_graphs(request, replays, trees):
    """Forward and backward graphs captured once, then replayed, with eager's numbers over training steps."""
    _with_trees(request, trees)
    ref = _model(2)
    model = _model(2).to(DEV)
    compiled = torch.compile(model, mode="reduce-overhead")
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        x, y = torch.randn(4, 16), torch.randn(4, 4)
        loss = nn.functional.mse_loss(compiled(x.to(DEV)), y.to(DEV))
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_loss = nn.functional.mse_loss(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(loss.detach().cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    assert len({id(g) for g in replays}) == 2  # one forward graph, one backward graph, never recorded again
    assert len(replays) == 2 * (4 if trees else 5)  # every step from the recording on
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == 0


@TREES
def test_reduce_overhead_writes_mutated_buffers_once_a_call(request, replays, trees):
    """A BatchNorm's running statistics, inputs the graph mutates at static addresses: the recording's
    warm-up run writes them too, and the first replay must not write them a second time."""
    _with_trees(request, trees)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).train()
    model = copy.deepcopy(ref).to(DEV)
    compiled = torch.compile(model, mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(4, 8)
        with torch.no_grad():
            got, want = compiled(x.to(DEV)).cpu(), ref(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for buffer, expected in zip(model[1].buffers(), ref[1].buffers()):
            torch.testing.assert_close(buffer.cpu(), expected, rtol=1e-5, atol=1e-6)
    assert len(replays) == (3 if trees else 4)


@TREES
def test_reduce_overhead_runs_a_graph_mutating_another_input_without_recording_it(request, replays, trees):
    """An input the graph mutates that is not at a static address would be written in the graph's copy of it
    and lost: as on CUDA, the callable runs as compiled and Inductor counts a skip."""
    _with_trees(request, trees)

    def accumulate(x, total):
        total.add_(x)
        return x * 2

    compiled = torch.compile(accumulate, mode="reduce-overhead")
    total, want = torch.zeros(4, device=DEV), torch.zeros(4)
    for step in range(3):
        x = torch.full((4,), float(step + 1))
        out = compiled(x.to(DEV), total)
        accumulate(x, want)
        torch.testing.assert_close(out.cpu(), x * 2)
        torch.testing.assert_close(total.cpu(), want)
    assert replays == []
    assert torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] == 1


@TREES
def test_reduce_overhead_records_a_graph_per_size_with_dynamic_shapes(request, replays, trees):
    """With dynamic shapes one compiled graph serves every size; each size gets a recording of its own."""
    _with_trees(request, trees)
    compiled = torch.compile(lambda x: x.sum(0) * 2, mode="reduce-overhead", dynamic=True)
    sizes = (3, 5, 3, 7, 5, 3)
    for n in sizes:
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x.to(DEV)).cpu(), x.sum(0) * 2)
    assert len({id(g) for g in replays}) == (2 if trees else 3)  # trees: the size seen once is warmed up only
    assert len(replays) == (3 if trees else 6)


def test_trees_raise_on_an_output_a_later_step_overwrote(replays):
    """The outputs of a step's warm-up and recording live in the trees' pool; read after the next step
    (cudagraph_mark_step_begin) has run over that memory they raise CUDA's error, not the later step's
    numbers. A clone taken before is the user's own."""
    compiled = torch.compile(lambda x: torch.tanh(x) * 3, mode="reduce-overhead")
    xs = [torch.randn(8) for _ in range(4)]
    with torch.no_grad():
        outputs, kept = [], []
        for x in xs:  # warm-up, recording, replays
            torch.compiler.cudagraph_mark_step_begin()
            outputs.append(compiled(x.to(DEV)))
            kept.append(outputs[-1].clone())
        for old in outputs[:2]:
            with pytest.raises(RuntimeError, match="overwritten by a subsequent run"):
                old + 1
        torch.testing.assert_close(outputs[-1].cpu(), torch.tanh(xs[-1]) * 3)
    for x, clone in zip(xs, kept):
        torch.testing.assert_close(clone.cpu(), torch.tanh(x) * 3)
    assert len(replays) == 3


def test_trees_record_a_branch_after_replays_from_the_pool_checkpoint(replays):
    """A graph's output fed to either of two graphs: the second branch is recorded after the first was
    replayed, so the trees restore the pool's layout checkpointed after the shared graph's recording
    (torch._C._cuda_setCheckpointPoolState on CUDA), and both branches replay with eager's numbers."""
    functions = {
        "stem": lambda x: torch.tanh(x) * 2,
        "left": lambda h: (h + 1).sin(),
        "right": lambda h: (h * h).cos(),
    }
    compiled = {name: torch.compile(f, mode="reduce-overhead") for name, f in functions.items()}
    with torch.no_grad():
        for name in compiled:  # compiling one function starts a new generation: compile them all first
            compiled[name](torch.randn(16, device=DEV))
            torch.compiler.cudagraph_mark_step_begin()
        for step in range(8):
            x = torch.randn(16)
            branch = "left" if step % 4 < 2 else "right"
            got = compiled[branch](compiled["stem"](x.to(DEV)))
            torch.testing.assert_close(got.cpu(), functions[branch](functions["stem"](x)), rtol=1e-6, atol=1e-6)
            torch.compiler.cudagraph_mark_step_begin()
    manager = torch._inductor.cudagraph_trees.get_manager(0, create_if_none_exists=False)
    assert manager is not None and manager.debug_checkpointing_counter >= 1
    assert len({id(g) for g in replays}) == 3


def test_trees_on_the_second_device(replays):
    """A model on mydev:1: its trees, pool and replays are that device's, the numbers eager's."""
    ref = _model(4)
    model = copy.deepcopy(ref).to("mydev:1")
    compiled = torch.compile(model, mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(4, 16)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        out, want = compiled(x.to("mydev:1")), ref(x)
        assert out.device == torch.device("mydev:1")
        out.square().sum().backward()
        want.square().sum().backward()
        torch.testing.assert_close(out.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-5)
    assert torch._inductor.cudagraph_trees.get_manager(1, create_if_none_exists=False) is not None
    assert len(replays) == 2 * 3  # from the recording on


def test_dynamo_cudagraphs_backend_replays_mydev_graphs(replays):
    """torch.compile(backend="cudagraphs"): Dynamo's graphs (not Inductor's) through the same trees."""
    ref = _model(3)
    model = _model(3).to(DEV)
    compiled = torch.compile(model, backend="cudagraphs")
    for _ in range(4):
        x = torch.randn(4, 16)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        out, want = compiled(x.to(DEV)), ref(x)
        torch.testing.assert_close(out.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-6)
        out.square().sum().backward()
        want.square().sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-5)
    assert len({id(g) for g in replays}) == 2 and len(replays) == 2 * 3


def test_trees_pool_is_given_back_at_reset():
    """The trees' graphs keep their pool reserved; once torch._dynamo.reset() has ended them and the
    compiled function and its outputs are gone, empty_cache gives the pool's memory back."""
    torch._dynamo.reset()
    gc.collect()
    x = torch.randn(256, 256, device=DEV)
    torch.mydev.empty_cache()
    before = torch.mydev.memory_reserved()
    compiled = torch.compile(lambda x: (x @ x.T).relu(), mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            out = compiled(x)
    torch.testing.assert_close(out.cpu(), (x.cpu() @ x.cpu().T).relu(), rtol=1e-4, atol=1e-4)
    assert torch.mydev.memory_reserved() > before
    del out, compiled
    torch._dynamo.reset()
    gc.collect()
    torch.mydev.empty_cache()
    assert torch.mydev.memory_reserved() == before


def test_cudagraph_trees_are_still_cuda_only_in_pytorch():
    """inductor/graph_trees.py runs torch's trees module again with CUDA's names meaning mydev's; once torch's
    trees ask the device's own interfaces (torch.accelerator's graph and allocator), drop it."""
    import inspect

    from torch._inductor import cudagraph_trees

    source = inspect.getsource(cudagraph_trees)
    assert "torch._C._cuda_getCheckpointState" in source and "torch.cuda.CUDAGraph()" in source
    assert ".is_cuda" in source


def test_inductor_still_refuses_graphs_on_mydev():
    """inductor/graphs.py makes Inductor accept mydev's graphs; once torch does by itself, drop that."""
    from torch._inductor import cudagraph_utils

    original = cudagraph_utils.check_multiple_devices_or_any_cpu_nodes._torch_original
    assert original({torch.device("mydev", 0): None}) is not None
    assert cudagraph_utils.check_multiple_devices_or_any_cpu_nodes({torch.device("mydev", 0): None}) is None


def test_fills_capture_without_a_first_call_at_the_call(python_subprocess):
    # A dense fill needs no host kernel (whose first call of a signature runs at the call, which a capture
    # refuses): backward's ones_like was refused in a capture whose warm-up had filled at the call on an
    # idle stream, so whether a capture worked depended on timing. In a fresh process, with no warm-up:
    result = python_subprocess("""
        import torch, my_device
        x = torch.randn(6, device="mydev")
        g = torch.mydev.MyDevGraph()
        with torch.mydev.graph(g):
            ones = torch.ones_like(x)
            halves = torch.empty(5, dtype=torch.float16, device="mydev").fill_(2.5)
            ints = torch.full((3,), 7, dtype=torch.int64, device="mydev")
        for _ in range(2):
            ones.zero_(); halves.zero_(); ints.zero_()
            g.replay()
            torch.mydev.synchronize()
            assert torch.equal(ones.cpu(), torch.ones(6))
            assert torch.equal(halves.cpu(), torch.full((5,), 2.5, dtype=torch.float16))
            assert torch.equal(ints.cpu(), torch.full((3,), 7))
        print("ok")
    """)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]
