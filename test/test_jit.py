"""TorchScript on mydev: to_backend("mydev") and the transparent fusion pass, against eager mydev."""
import io
import pytest
import torch
from torch import nn

import my_device.compiler as mc
import my_device.jit as mj

DEV = "mydev"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)).to(DEV).eval(), torch.randn(4, 16)


def _cnn():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 5))
    return m.to(DEV).eval(), torch.randn(2, 3, 8, 8)


@pytest.mark.parametrize("build", [_mlp, _cnn], ids=["mlp", "cnn"])
def test_lowered_module_matches_eager_and_runs_through_the_backend(build):
    model, x = build()
    x = x.to(DEV)
    lowered = mj.to_mydev(torch.jit.script(model), (x,))
    # The lowered module's code calls the backend; the ops are gone from it.
    inner = lowered._c.getattr("__loweredModule__")
    code = inner.forward.code
    assert "__backend" in code and "execute" in code and "linear" not in code and "conv" not in code
    before = mc.counters()["launches"]
    with torch.no_grad():
        torch.testing.assert_close(lowered(x), model(x))
    assert mc.counters()["launches"] == before + 1  # the whole method is one launch


def test_save_and_load_in_a_fresh_process_and_the_lite_interpreter(tmp_path, python_subprocess):
    model, x = _mlp()
    x = x.to(DEV)
    lowered = mj.to_mydev(torch.jit.script(model), (x,))
    path = tmp_path / "lowered.pt"
    torch.jit.save(lowered, str(path))
    with torch.no_grad():
        expected = model(x).cpu()
    torch.save({"x": x.cpu(), "y": expected}, str(tmp_path / "io.pt"))
    # the same process
    torch.testing.assert_close(torch.jit.load(str(path))(x), expected.to(DEV))
    # a fresh process: `import torch` autoloads mydev, which registers the backend
    r = python_subprocess(f"""
        import torch, warnings
        warnings.simplefilter("ignore")
        io = torch.load({str(tmp_path / "io.pt")!r})
        m = torch.jit.load({str(path)!r})
        import my_device.compiler as mc
        before = mc.counters()["launches"]
        out = m(io["x"].to("mydev"))
        assert mc.counters()["launches"] == before + 1, mc.counters()
        torch.testing.assert_close(out.cpu(), io["y"])
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]
    # the lite interpreter
    buffer = io.BytesIO(lowered._save_to_buffer_for_lite_interpreter())
    from torch.jit.mobile import _load_for_lite_interpreter

    lite = _load_for_lite_interpreter(buffer)
    torch.testing.assert_close(lite(x), expected.to(DEV))


def test_selective_lowering():
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.body(x)) * 3

    torch.manual_seed(0)
    model = Outer().to(DEV).eval()
    x = torch.randn(5, 8, device=DEV)
    scripted = torch.jit.script(model)
    mixed = mj.to_mydev_selective(scripted, {"body": (x,)}, ["body"])
    with torch.no_grad():
        torch.testing.assert_close(mixed(x), model(x))
    assert "__loweredModule__" in str(mixed.body.code)


def test_unsupported_op_fails_at_lowering_with_its_source():
    class DataDependent(nn.Module):
        def forward(self, x):
            y = x * 2
            return torch.nonzero(y > 0).float().sum() + y  # output shape depends on the data

    x = torch.randn(3, 4, device=DEV)
    with pytest.raises(RuntimeError, match=r"(?s)cannot lower aten::nonzero.*torch.nonzero\(y > 0\)"):
        mj.to_mydev(torch.jit.script(DataDependent()), (x,))


def test_shape_error_at_execute_names_the_source_line():
    model, x = _mlp()
    lowered = mj.to_mydev(torch.jit.script(model), (x.to(DEV),))
    keep = torch.ones(3, device=DEV)
    with pytest.raises(RuntimeError, match=r"(?s)compiled for Float\[4,16\].*linear\.py:\d+"):
        lowered(torch.randn(5, 16, device=DEV))
    with torch.no_grad():
        torch.testing.assert_close(lowered(x.to(DEV)), model(x.to(DEV)))
    assert keep.tolist() == [1.0, 1.0, 1.0]


class _WithBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(16, 16)
        self.l2 = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.tanh(self.l1(x)) * 2 + 1
        h = torch.nonzero(h > 0).sum() + h  # not expressible: splits the graph
        return torch.relu(self.l2(h))


def _groups(graph):
    return [n for n in graph.nodes() if n.kind() == "mydev::CompilationGroup"]


def test_transparent_mode_groups_and_splits_at_an_unsupported_op():
    torch.manual_seed(0)
    model = _WithBreak().to(DEV).eval()
    scripted = torch.jit.script(model)
    x = torch.randn(4, 16, device=DEV)
    mj.reset_stats()
    with torch.no_grad(), mj.fusion():
        for _ in range(3):
            out = scripted(x)
        graph = torch.jit.last_executed_optimized_graph()
    groups = _groups(graph)
    assert len(groups) == 2, graph
    assert any(n.kind() == "aten::nonzero" for n in graph.nodes())
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))
    assert mj.stats()["groups_compiled"] == 2 and mj.stats()["groups_run"] >= 2


def test_transparent_mode_on_a_cnn():
    model, x = _cnn()
    x = x.to(DEV)
    scripted = torch.jit.script(model)
    with torch.no_grad(), mj.fusion():
        for _ in range(3):
            out = scripted(x)
        graph = torch.jit.last_executed_optimized_graph()
    assert len(_groups(graph)) == 1, graph
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))


def test_transparent_mode_leaves_training_graphs_alone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh()).to(DEV)
    scripted = torch.jit.script(model)
    x = torch.randn(3, 8, device=DEV)
    with mj.fusion():
        for _ in range(3):
            scripted(x).sum().backward()
        graph = torch.jit.last_executed_optimized_graph()
    assert _groups(graph) == []
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g / 3, p.grad)


def test_a_traced_module_that_reads_its_input_shape_lowers():
    # Nearly every traced model reads a shape (B, T, C = x.size()); the trace computes with the sizes
    # as tensors (prim::NumToTensor, aten::mul) and turns them back into ints for a view: they fold.
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            B, T, C = x.size()
            y = self.proj(x).view(B * T, C).relu()
            return y.view(B, T, C) * (C ** -0.5)

    torch.manual_seed(0)
    block = Block().eval()
    x = torch.randn(2, 3, 8)
    traced = torch.jit.trace(block, x)
    lowered = mj.to_mydev(traced, (x.to("mydev"),))
    torch.testing.assert_close(lowered(x.to("mydev")).cpu(), block(x))


def _doubled(inp):
    return inp * 2


def _halved(inp):
    return inp / 2


class _TwoInputsTracedAsInp(nn.Module):
    # The tracer names each input after the first parameter it meets: both become `inp` (inp.1, inp).
    def forward(self, *xs):
        return _doubled(xs[0]) - _halved(xs[1])


def _two_inputs_named_alike():
    xs = (torch.randn(3, device=DEV), torch.randn(3, device=DEV))
    traced = torch.jit.trace(_TwoInputsTracedAsInp(), xs)
    names = [v.debugName().split(".")[0] for v in list(traced.graph.inputs())[1:]]
    assert names == ["inp", "inp"], names
    return traced, xs, (xs[0] * 2 - xs[1] / 2).cpu()


def test_a_traced_module_whose_inputs_share_a_name_gets_each_input():
    traced, xs, expected = _two_inputs_named_alike()
    torch.testing.assert_close(mj.to_mydev(traced, xs)(*xs).cpu(), expected)


def test_to_backend_still_merges_input_names():
    # to_mydev renames such inputs (csrc/jit/Bindings.cpp, distinct_argument_names) because torch's to_backend wrapper
    # passes one of them twice. When this starts failing, torch keeps the names apart and the rename can go.
    traced, xs, expected = _two_inputs_named_alike()
    lowered = torch._C._jit_to_backend("mydev", traced, {"forward": {"inputs": xs}})
    assert not torch.allclose(lowered(*xs).cpu(), expected)


def test_a_traced_nanogpt_style_block_lowers():
    """A nanoGPT-style block, traced: shape reads, head sizes computed from them (`C // n_head`, a number the
    trace records as a tensor), split, views and transposes, causal scaled_dot_product_attention, layer norms,
    gelu and residuals. Lowered with to_mydev, it equals eager on the CPU."""

    class Block(nn.Module):
        def __init__(self, C=32, n_head=4):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.attn, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
            self.n_head = n_head

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.attn(self.ln1(x)).split(C, dim=2)
            q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.fc2(nn.functional.gelu(self.fc(self.ln2(x))))

    torch.manual_seed(0)
    block = Block().eval()
    x = torch.randn(2, 8, 32)
    lowered = mj.to_mydev(torch.jit.trace(block, x), (x.to("mydev"),))
    with torch.no_grad():
        torch.testing.assert_close(lowered(x.to("mydev")).cpu(), block(x), rtol=1e-5, atol=1e-5)


def test_transparent_mode_applies_to_a_class_optimized_before():
    """A scripted class run (and so optimized) before transparent mode is on still gets its groups inside
    fusion(): TorchScript shares the optimized plan between instances, and enable() flushes live plans."""

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return (self.lin(x).relu() * 2 + 1).tanh()

    torch.manual_seed(0)
    x = torch.randn(4, 8, device="mydev")
    before = torch.jit.script(Head().to("mydev"))
    for _ in range(3):
        before(x)
    model = Head().to("mydev")
    scripted = torch.jit.script(model)
    mj.reset_stats()
    with mj.fusion():
        for _ in range(3):
            out = scripted(x)
    assert mj.stats()["groups_compiled"] >= 1 and mj.stats()["groups_run"] >= 1
    torch.testing.assert_close(out.cpu(), model.cpu()(x.cpu()))
