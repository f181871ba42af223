"""The mydev graph compiler (csrc/compiler) and torch.compile(backend="mydev"), against eager mydev and CPU."""
import copy
import os
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import my_device
import my_device.compiler as mc
from my_device import ops

DEV = "mydev"


def _models():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, bias=False),
                        nn.BatchNorm2d(8), nn.Sigmoid(), nn.Flatten(), nn.Linear(8 * 2 * 2, 5))
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)

    class CustomOps(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 6) * 0.3)
            self.b = nn.Parameter(torch.zeros(8))
            self.norm = nn.Parameter(torch.ones(8))

        def forward(self, x):
            h = ops.fused_linear_gelu(x, self.w, self.b)
            return ops.rms_norm(h, self.norm, 1e-6) * 2.0

    return {
        "mlp": (mlp, lambda: torch.randn(4, 16)),
        "cnn": (cnn, lambda: torch.randn(2, 3, 8, 8)),
        "transformer": (layer, lambda: torch.randn(2, 5, 16)),
        "custom_ops": (CustomOps(), lambda: torch.randn(3, 6)),
    }


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def train_compiled_and_eager(name, backend):
    """3 SGD steps of model `name` compiled with `backend` beside the same model run eagerly on mydev;
    asserts outputs, parameters and gradients agree and nothing ran through the CPU fallback."""
    model, make_input = _models()[name]
    eager = model.to(DEV)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend=backend)
    # SGD, not Adam: Adam's first steps turn a gradient that is zero up to rounding (the conv bias
    # before batch norm, the attention's key bias) into a full step in a random direction.
    opt_e = torch.optim.SGD(eager.parameters(), lr=1e-2, momentum=0.9)
    opt_c = torch.optim.SGD(compiled_model.parameters(), lr=1e-2, momentum=0.9)
    tol = dict(rtol=1e-4, atol=1e-5)
    with my_device.track_fallbacks() as fb:
        for _ in range(3):
            x = make_input().to(DEV)
            for m, opt in ((eager, opt_e), (compiled, opt_c)):
                opt.zero_grad()
                out = m(x)
                (out.float() ** 2).mean().backward()
                opt.step()
            torch.testing.assert_close(compiled(x), eager(x), **tol)
    assert fb.counts() == {}
    for p, q in zip(compiled_model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, **tol)
        torch.testing.assert_close(p.grad, q.grad, **tol)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "custom_ops"])
def test_training_matches_eager(name):
    mc.reset_counters()
    train_compiled_and_eager(name, "mydev")
    c = mc.counters()
    assert c["graphs_eager"] == 0, mc.dump()
    assert c["graphs_compiled"] >= 2  # forward and backward
    assert c["ops_launched"] > c["launches"]  # a launch runs a whole graph


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "custom_ops"])
def test_no_graph_break(name):
    model, make_input = _models()[name]
    model = model.to(DEV)
    explanation = torch._dynamo.explain(model)(make_input().to(DEV))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_mlp_fuses_and_matches_cpu_without_fallback():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    x = torch.randn(4, 16)
    ref = model(x)
    ref.sum().backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    dev_model = model.to(DEV)
    mc.reset_counters()
    with my_device.track_fallbacks() as fb:
        out = torch.compile(dev_model, backend="mydev")(x.to(DEV))
        out.sum().backward()
    assert fb.counts() == {}
    torch.testing.assert_close(out.cpu(), ref)
    for p, g in zip(dev_model.parameters(), ref_grads):
        torch.testing.assert_close(p.grad.cpu(), g)
    # tanh's backward (1 - y*y) * grad is one fused kernel.
    assert mc.counters()["fused_groups"] >= 1
    assert "fused group" in mc.dump()


def check_dynamic_compiles_once(backend):
    """dynamic=True over three batch sizes: outputs equal eager, and the frame compiles once."""
    import torch._dynamo.testing

    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).to(DEV)
    compiled = torch.compile(model, backend=counter, dynamic=True)
    for batch in (3, 5, 9):
        x = torch.randn(batch, 8, device=DEV)
        torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 1


def test_dynamic_shapes_compile_once():
    check_dynamic_compiles_once("mydev")
    assert mc.counters()["graphs_eager"] == 0


def test_fullgraph_with_custom_ops():
    torch.manual_seed(0)
    w, b, norm = torch.randn(8, 6, device=DEV), torch.randn(8, device=DEV), torch.rand(8, device=DEV)

    def f(x):
        return ops.swiglu(ops.rms_norm(ops.fused_linear_gelu(x, w, b), norm, 1e-6), x @ w.t())

    x = torch.randn(3, 6, device=DEV)
    torch.testing.assert_close(torch.compile(f, backend="mydev", fullgraph=True)(x), f(x))


def test_program_is_one_queued_launch():
    """The host returns before the program ran: its stream is held by a test kernel."""
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh()).to(DEV)
    compiled = torch.compile(model, backend="mydev")
    x = torch.randn(2, 8, device=DEV)
    with torch.no_grad():
        expected = model(x)
        compiled(x)  # compile
        torch.mydev.synchronize()
        before = mc.counters()["launches"]
        my_device._C._test_launch_hold(0)
        try:
            torch.mydev.set_sync_debug_mode("error")
            out = compiled(x)  # would raise if it made the host wait
            torch.mydev.set_sync_debug_mode(0)
            assert not torch.mydev.current_stream().query()
        finally:
            torch.mydev.set_sync_debug_mode(0)
            my_device._C._test_release_hold()
    assert mc.counters()["launches"] == before + 1
    torch.testing.assert_close(out, expected)


# ------------------------------------------------------------------ programs written as text

def _run(text, *inputs):
    return mc.compile(text).run([t.to(DEV) for t in inputs])


UNARY = {
    "neg": torch.neg, "abs": torch.abs, "relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "exp": torch.exp, "sin": torch.sin, "cos": torch.cos, "erf": torch.erf, "expm1": torch.expm1,
    "sign": torch.sign,
}
POSITIVE_UNARY = {"log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal,
                  "log1p": torch.log1p}


@pytest.mark.parametrize("op", sorted({**UNARY, **POSITIVE_UNARY}))
def test_fused_unary_rule_matches_eager(op):
    fn = {**UNARY, **POSITIVE_UNARY}[op]
    x = torch.randn(5, 7)
    if op in POSITIVE_UNARY:
        x = x.abs() + 0.1
    # op, then a multiply: two ops, so they are fused into one kernel.
    program = mc.compile(f"""program unary
input %0 : Float[5,7]{{7,1}}+0
%1 = aten::{op}(%0) : Float[5,7]{{7,1}}+0
%2 = aten::mul.Tensor(%1, %0) : Float[5,7]{{7,1}}+0
output %2
""")
    assert program.stats()["fused_groups"] == 1
    (out,) = program.run([x.to(DEV)])
    torch.testing.assert_close(out.cpu(), fn(x) * x)


def test_transcendental_rules_without_vector_math(python_subprocess):
    """The libm path of the fused kernel (machines without AVX2) gives eager's results too; this machine's
    default path is covered by the rule tests above."""
    ops = sorted({**UNARY, **POSITIVE_UNARY})
    code = """
        import sys, torch, my_device, my_device.compiler as mc
        from test_compiler import UNARY, POSITIVE_UNARY
        fns = {**UNARY, **POSITIVE_UNARY}
        assert not my_device._C._compiler.vector_math_enabled()
        for op in sys.argv[1:]:
            x = torch.randn(5, 7)
            if op in POSITIVE_UNARY:
                x = x.abs() + 0.1
            text = "\\n".join(["program unary", "input %0 : Float[5,7]{7,1}+0",
                                "%1 = aten::" + op + "(%0) : Float[5,7]{7,1}+0", "output %1"]) + "\\n"
            p = mc.compile(text)
            assert p.stats()["fused_groups"] == 1
            (out,) = p.run([x.to("mydev")])
            torch.testing.assert_close(out.cpu(), fns[op](x))
        print("ok", len(sys.argv) - 1)
    """
    result = python_subprocess(code + "\n", env={"MYDEV_COMPILER_VECTOR_MATH": "0", "PYTHONPATH": "test"},
                               args=ops)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", str(len(ops))]


BINARY = {
    "add.Tensor": (lambda a, b: a + 2 * b, ", i2"), "sub.Tensor": (lambda a, b: a - b, ", i1"),
    "mul.Tensor": (torch.mul, ""), "div.Tensor": (torch.div, ""), "maximum": (torch.maximum, ""),
    "minimum": (torch.minimum, ""), "tanh_backward": (lambda g, y: g * (1 - y * y), ""),
    "sigmoid_backward": (lambda g, y: g * y * (1 - y), ""),
    "gelu_backward": (lambda g, x: torch.ops.aten.gelu_backward(g, x.expand_as(g).contiguous()), ', s"none"'),
}


@pytest.mark.parametrize("op", sorted(BINARY))
def test_fused_binary_rule_matches_eager(op):
    fn, extra = BINARY[op]
    a, b = torch.randn(4, 6), torch.randn(6)  # b broadcasts
    program = mc.compile(f"""program binary
input %0 : Float[4,6]{{6,1}}+0
input %1 : Float[6]{{1}}+0
%2 = aten::{op}(%0, %1{extra}) : Float[4,6]{{6,1}}+0
%3 = aten::relu(%2) : Float[4,6]{{6,1}}+0
output %3 %2
""")
    assert program.stats()["fused_groups"] == 1
    relu, raw = program.run([a.to(DEV), b.to(DEV)])
    torch.testing.assert_close(raw.cpu(), fn(a, b))
    torch.testing.assert_close(relu.cpu(), torch.relu(fn(a, b)))


def test_comparisons_where_and_threshold_backward():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    text = """program cmp
input %0 : Float[3,4]{4,1}+0
input %1 : Float[3,4]{4,1}+0
%2 = aten::gt.Tensor(%0, %1) : Bool[3,4]{4,1}+0
%3 = aten::where.self(%2, %0, %1) : Float[3,4]{4,1}+0
%4 = aten::threshold_backward(%3, %0, f0.25) : Float[3,4]{4,1}+0
%5 = aten::clamp(%4, f-0.5, f0.5) : Float[3,4]{4,1}+0
%6 = aten::le.Scalar(%5, f0.1) : Bool[3,4]{4,1}+0
output %5 %6
"""
    program = mc.compile(text)
    assert program.stats()["fused_groups"] == 1 and program.stats()["fused_nodes"] == 5
    out, mask = program.run([a.to(DEV), b.to(DEV)])
    where = torch.where(a > b, a, b)
    expected = torch.ops.aten.threshold_backward(where, a, 0.25).clamp(-0.5, 0.5)
    torch.testing.assert_close(out.cpu(), expected)
    assert torch.equal(mask.cpu(), expected <= 0.1)


@pytest.mark.parametrize("reduction,dims,keepdim", [
    ("sum.dim_IntList", [0], True), ("sum.dim_IntList", [1], False), ("mean.dim", [-1], True),
    ("amax", [0], False), ("amin", [0, 1], False), ("sum.dim_IntList", [], False),
])
def test_reduction_fused_with_its_producer(reduction, dims, keepdim):
    x = torch.randn(37, 70)
    y = torch.randn(70)
    dims_text = ", ".join(f"i{d}" for d in dims)
    args = f"%3, [{dims_text}], b{int(keepdim)}" + (", n" if reduction != "amax" and reduction != "amin" else "")
    ref_fn = {"sum.dim_IntList": torch.sum, "mean.dim": torch.mean, "amax": torch.amax, "amin": torch.amin}[reduction]
    expected = ref_fn(torch.tanh(x * y), dim=dims if dims else list(range(2)), keepdim=keepdim)
    sizes = ",".join(str(s) for s in expected.shape)
    strides = ",".join(str(s) for s in expected.stride())
    program = mc.compile(f"""program reduce
input %0 : Float[37,70]{{70,1}}+0
input %1 : Float[70]{{1}}+0
%2 = aten::mul.Tensor(%0, %1) : Float[37,70]{{70,1}}+0
%3 = aten::tanh(%2) : Float[37,70]{{70,1}}+0
%4 = aten::{reduction}({args}) : Float[{sizes}]{{{strides}}}+0
output %4
""")
    assert program.stats()["fused_nodes"] == 3, program.dump()
    (out,) = program.run([x.to(DEV), y.to(DEV)])
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)


def _geometry(t):
    sizes = ",".join(str(s) for s in t.shape)
    strides = ",".join(str(s) for s in t.stride())
    return f"Float[{sizes}]{{{strides}}}+{t.storage_offset()}"


@pytest.mark.parametrize("bias_shape,transposed,beta,alpha", [
    ((5,), True, 1, 1), ((3, 5), False, 1, 1), ((3, 1), True, 0.5, 2.0), ((1, 5), False, 1, -1.5),
    ((5,), True, 0, 1), ((5,), False, 1, 0), (None, True, None, None), (None, False, None, None),
])
def test_small_matrix_products_are_gemm_steps(bias_shape, transposed, beta, alpha):
    """Small Float addmm/mm run as the program's own GemmKernel (not the CPU kernel): CPU's result for
    every bias broadcast, a transposed or row-major right operand, and coefficients; beta 0 ignores a NaN
    bias, as addmm does."""
    torch.manual_seed(0)
    a = torch.randn(3, 7)
    if alpha == 0:
        a[0, 0] = float("inf")  # alpha 0 leaves the product out, Inf and NaN included, as BLAS does
    b = torch.randn(5, 7).t() if transposed else torch.randn(7, 5)
    out = torch.empty(3, 5)
    if bias_shape is None:
        call, expected, inputs = "aten::mm(%0, %1)", a @ b, [a, b]
    else:
        bias = torch.randn(bias_shape)
        if beta == 0:
            bias.fill_(float("nan"))
        call = f"aten::addmm(%2, %0, %1, f{beta}, f{alpha})"
        expected, inputs = torch.addmm(bias, a, b, beta=beta, alpha=alpha), [a, b, bias]
    base = [f"input %{i} : {_geometry(t)}" for i, t in enumerate(inputs)]
    program = mc.compile("\n".join(["program gemm", *base, f"%9 = {call} : {_geometry(out)}", "output %9"]) + "\n")
    assert program.stats()["gemms"] == 1, program.dump()
    assert "gemm (" in program.dump()
    # The transposed operand reaches the program as a strided view of its device copy.
    dev_inputs = [t.to(DEV) if t.is_contiguous() else t.t().contiguous().to(DEV).t() for t in inputs]
    (got,) = program.run(dev_inputs)
    torch.testing.assert_close(got.cpu(), expected)


def test_overlapping_inputs_of_an_in_place_step_are_refused_as_in_eager():
    """Two inputs over one storage reach the program's steps as views of one host storage, so ATen's
    overlap check refuses a partly overlapping in-place op as eager does (reported at the next sync)."""
    program = mc.compile("""program overlap
input %0 : Float[7]{1}+0
input %1 : Float[7]{1}+1
%2 = aten::add_.Tensor(%0, %1, i1) : Float[7]{1}+0
output %2
""")
    x = torch.arange(8.0, device=DEV)
    with pytest.raises(RuntimeError, match="single memory location"):
        x[:-1].add_(x[1:])
    with pytest.raises(RuntimeError, match="single memory location"):
        program.run([x[:-1], x[1:]])
        torch.mydev.synchronize()
    torch.testing.assert_close(program.run([torch.zeros(7, device=DEV), torch.ones(8, device=DEV)[1:]])[0].cpu(),
                               torch.ones(7))


def test_large_products_and_other_dtypes_keep_the_cpu_kernel():
    """Above the Gemm step's size, or in another dtype, addmm/mm stay calls of the CPU kernel."""
    big = mc.compile("""program big
input %0 : Float[128,128]{128,1}+0
%1 = aten::mm(%0, %0) : Float[128,128]{128,1}+0
output %1
""")
    double = mc.compile("""program double
input %0 : Double[4,4]{4,1}+0
%1 = aten::mm(%0, %0) : Double[4,4]{4,1}+0
output %1
""")
    assert big.stats()["gemms"] == 0 and double.stats()["gemms"] == 0
    x = torch.randn(128, 128) / 8
    torch.testing.assert_close(big.run([x.to(DEV)])[0].cpu(), x @ x)
    y = torch.randn(4, 4, dtype=torch.float64)
    torch.testing.assert_close(double.run([y.to(DEV)])[0].cpu(), y @ y)


@pytest.mark.parametrize("size,strided", [(64, False), (64, True), (40000, False)])
def test_lone_pointwise_op_as_kernel_or_call(size, strided):
    """A lone small pointwise op is a fused kernel (a flat pass over dense operands, TensorIterator over
    strided ones); a large one stays the ATen call. Both give CPU's result."""
    x = torch.randn(size, 2)
    geometry = f"Float[2,{size}]{{1,2}}+0" if strided else f"Float[{size},2]{{2,1}}+0"
    shape = "[2," + str(size) + "]{" + str(size) + ",1}" if strided else f"[{size},2]{{2,1}}"
    program = mc.compile(f"""program lone
input %0 : {geometry}
%1 = aten::tanh(%0) : Float{shape}+0
output %1
""")
    assert program.stats()["fused_groups"] == (1 if size < 32768 else 0), program.dump()
    dev = x.to(DEV).t() if strided else x.to(DEV)
    ref = x.t() if strided else x
    (out,) = program.run([dev])
    torch.testing.assert_close(out.cpu(), torch.tanh(ref))


@pytest.mark.parametrize("geometry,expected", [
    ("Float[8,32]{32,1}+0", "same layout"),
    ("Float[8,32]{1,8}+0", "contiguous copy of a transposed input"),
])
def test_a_clone_is_one_copy_into_its_planned_buffer(geometry, expected):
    """A clone copies its input into the buffer the program planned for it (an output here, an arena
    buffer in the middle of a chain), in the layout the program says, and equals the CPU's clone."""
    program = mc.compile(f"""program clones
input %0 : {geometry}
%1 = aten::clone(%0, n) : Float[8,32]{{32,1}}+0
%2 = aten::clone(%1, n) : Float[8,32]{{32,1}}+0
%3 = aten::mul.Tensor(%2, %2) : Float[8,32]{{32,1}}+0
output %1 %3
""")
    dump = program.dump()
    assert dump.count("copy aten::clone") == 2, dump
    assert "arena 1024 bytes" in dump, dump  # %2 is planned, not allocated by a call
    x = torch.randn(8, 32) if "{32,1}" in geometry else torch.randn(32, 8).t()
    first, squared = program.run([x.to(DEV) if "{32,1}" in geometry else x.t().contiguous().to(DEV).t()])
    torch.testing.assert_close(first.cpu(), x.clone(), rtol=0, atol=0)
    assert first.stride() == (32, 1), expected
    torch.testing.assert_close(squared.cpu(), x * x, rtol=0, atol=0)


def gradients_equal_eager(net, x, rtol=1e-4, atol=1e-5):
    """Three training steps of `net` beside a copy compiled with backend="mydev": the gradients agree; returns
    the last two programs' dumps."""
    twin = copy.deepcopy(net)
    compiled = torch.compile(twin, backend="mydev")
    for _ in range(3):
        for m in (net, compiled):
            m.zero_grad()
            m(x).square().mean().backward()
    for p, q in zip(net.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=rtol, atol=atol)
    return mc.dump(2)


def test_dropout_clones_and_split_bias_adds_leave_the_forward():
    """Training-mode dropout with p=0 traces as a clone, and a linear layer over a batch of sequences as a
    product and a separate bias add: the forward program copies no activation and makes each product one
    addmm, and training still equals eager's. A clone returned to the caller stays a copy of its own."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.0), nn.Linear(32, 8)).to(DEV)
    dumps = gradients_equal_eager(net, torch.randn(4, 5, 16, device=DEV), rtol=1e-5, atol=1e-6)
    forward = next(d for d in dumps.split("program ")[1:] if d.startswith("mydev_forward"))
    assert "aten::clone" not in forward and forward.count("aten::addmm(") == 2, forward
    assert "aten::mm(" not in forward and "aten::add.Tensor" not in forward, forward

    def column(a, w, b):  # the product viewed as one column and broadcast against the bias: no addmm gives that
        return (a @ w).view(96, 1) + b

    a, w, bias = torch.randn(6, 4), torch.randn(4, 16), torch.randn(16)
    with torch.no_grad():
        out = torch.compile(column, backend="mydev")(a.to(DEV), w.to(DEV), bias.to(DEV))
    torch.testing.assert_close(out.cpu(), column(a, w, bias))
    assert "aten::addmm" not in mc.dump(1), mc.dump(1)

    def twice(a):
        return (a * 2).clone(), a.clone()

    a = torch.randn(6, device=DEV)
    doubled, copied = torch.compile(twice, backend="mydev")(a)
    copied.add_(1)
    torch.testing.assert_close(a.cpu() + 1, copied.cpu())
    torch.testing.assert_close(doubled.cpu(), a.cpu() * 2)


def test_chains_of_copies_and_views_become_one_pass():
    """Clones, views and a cat that only rearrange their sources become one strided read of each source and
    one copy, where each source's share is a strided view of it (nn.MultiheadAttention's backward moves its
    three gradients through four copies); a rearrangement no strided view gives keeps its copies, as does one
    of the graph's inputs (whose storage offset is the caller's). Values as eager's, bit for bit."""
    def stacked(a, b):
        return torch.cat([a.transpose(0, 1).contiguous().unsqueeze(0), b.transpose(0, 1).contiguous().unsqueeze(0)]) * 2

    def merged(a, b):  # rows of a (2, 4, 3) as (4, 6): its dims 0 and 2 merged, no stride gives that
        return torch.cat([a.permute(1, 0, 2).contiguous().view(4, 6), b.permute(1, 0, 2).contiguous().view(4, 6)]) * 2

    def computed(fn):
        return lambda a, b: fn(a * 3, b - 1)

    for fn, shape, copies in ((computed(stacked), (5, 7), 1), (stacked, (5, 7), 3), (computed(merged), (2, 4, 3), 3)):
        torch._dynamo.reset()
        a, b = torch.randn(shape), torch.randn(shape)
        with torch.no_grad():
            out = torch.compile(fn, backend="mydev")(a.to(DEV), b.to(DEV))
        torch.testing.assert_close(out.cpu(), fn(a, b), rtol=0, atol=0)
        dump = mc.dump(1)
        steps = [line for line in dump.splitlines() if line.startswith("step")]
        assert sum("clone" in line or "aten::cat" in line for line in steps) == copies, dump
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).to(DEV)
    dumps = gradients_equal_eager(layer, torch.randn(4, 8, 32, device=DEV))
    backward = next(d for d in dumps.split("program ")[1:] if d.startswith("mydev_backward"))
    assert backward.count("aten::as_strided(") == 3 and backward.count("aten::cat(") == 1, backward
    assert sum(line.startswith("step") and "clone" in line for line in backward.splitlines()) == 1, backward


def test_memory_plan_reuses_dead_intermediates():
    # a chain of matrix products: each intermediate dies after the next product.
    lines = ["program chain", "input %0 : Float[32,32]{32,1}+0"]
    for i in range(1, 6):
        lines.append(f"%{i} = aten::mm(%{i - 1}, %0) : Float[32,32]{{32,1}}+0")
    lines.append("output %5")
    program = mc.compile("\n".join(lines) + "\n")
    stats = program.stats()
    assert stats["peak_bytes"] < stats["unplanned_bytes"], program.dump()
    assert stats["peak_bytes"] == 2 * 32 * 32 * 4  # two live at a time
    x = torch.randn(32, 32) / 8
    (out,) = program.run([x.to(DEV)])
    expected = x
    for _ in range(5):
        expected = expected @ x
    torch.testing.assert_close(out.cpu(), expected)


def test_views_of_inputs_and_outputs_alias_as_eager():
    x = torch.randn(4, 6)
    program = mc.compile("""program views
input %0 : Float[4,6]{6,1}+0
%1 = aten::permute(%0, [i1, i0]) : Float[6,4]{1,6}+0
%2 = aten::mul.Tensor(%1, %1) : Float[6,4]{4,1}+0
%3 = aten::slice.Tensor(%2, i0, i1, i3, i1) : Float[2,4]{4,1}+4
output %1 %3 %0
""")
    xd = x.to(DEV)
    t, sl, same = program.run([xd])
    assert same is xd
    assert t.untyped_storage().data_ptr() == xd.untyped_storage().data_ptr() and t.stride() == (1, 6)
    torch.testing.assert_close(sl.cpu(), (x.t() * x.t())[1:3])
    assert sl.storage_offset() == 4


def test_bad_programs_and_inputs_raise_clear_errors_and_lose_nothing():
    keep = torch.arange(6.0, device=DEV)
    with pytest.raises(RuntimeError, match="line 3.*unknown dtype 'Flaot'"):
        mc.compile("program p\ninput %0 : Float[2]{1}+0\n%1 = aten::neg(%0) : Flaot[2]{1}+0\noutput %1\n")
    with pytest.raises(RuntimeError, match="unknown operator 'aten::no_such_op'"):
        mc.compile("program p\ninput %0 : Float[2]{1}+0\n%1 = aten::no_such_op(%0) : Float[2]{1}+0\noutput %1\n")
    with pytest.raises(RuntimeError, match="used before it is defined"):
        mc.compile("program p\n%1 = aten::neg(%0) : Float[2]{1}+0\noutput %1\n")
    program = mc.compile("program p\ninput %0 : Float[2]{1}+0\n%1 = aten::neg(%0) : Float[2]{1}+0\noutput %1\n")
    with pytest.raises(RuntimeError, match=r"input 0 is Float\[3\].*compiled for Float\[2\]"):
        program.run([torch.ones(3, device=DEV)])
    with pytest.raises(RuntimeError, match="must be a mydev tensor or a 0-dim CPU tensor, got cpu"):
        program.run([torch.ones(2)])
    (out,) = program.run([torch.ones(2, device=DEV)])
    assert out.tolist() == [-1.0, -1.0]
    assert keep.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_failure_inside_a_program_is_reported_at_the_next_sync():
    program = mc.compile("""program gather_prog
input %0 : Float[4]{1}+0
input %1 : Long[2]{1}+0
%2 = aten::gather(%0, i0, %1, b0) : Float[2]{1}+0
%3 = aten::mul.Tensor(%2, %2) : Float[2]{1}+0
output %3
""")
    x = torch.arange(4.0, device=DEV)
    (out,) = program.run([x, torch.tensor([0, 9], device=DEV)])  # queued: no error yet
    with pytest.raises(RuntimeError, match=r"gather_prog: aten::gather \(line 4\).*out of bounds"):
        torch.mydev.synchronize()
    # Its outputs were zeroed, not left as whatever memory held: work queued behind the failed program ran
    # before the error was reported, and a kernel that read one as indices crashed (embedding_bag's backward).
    assert out.tolist() == [0.0, 0.0]
    # the device and other tensors still work
    (ok,) = program.run([x, torch.tensor([1, 3], device=DEV)])
    assert ok.tolist() == [1.0, 9.0]
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]


def product_program(rows, depth):
    """A program of an addmm, (rows, depth) by (depth, rows) with a bias row, whose result it multiplies by the
    first operand, each product in 2 parts; with its CPU inputs and the CPU's result."""
    import my_device.compiler as mc

    big, small = f"Float[{rows},{depth}]{{{depth},1}}+0", f"Float[{depth},{rows}]{{{rows},1}}+0"
    program = mc.compile(f"program product\ninput %0 : {big}\ninput %1 : {small}\ninput %2 : Float[{rows}]{{1}}+0\n"
                         f"%3 = aten::addmm(%2, %0, %1, f0.5, f2.0) : Float[{rows},{rows}]{{{rows},1}}+0\n"
                         f"%4 = aten::mm(%3, %0) : {big}\noutput %4\n")
    assert program.dump().count("in 2 parts") == 2, program.dump()
    a, b, bias = torch.randn(rows, depth) / depth ** 0.5, torch.randn(depth, rows) / depth ** 0.5, torch.randn(rows)
    return program, (a, b, bias), torch.addmm(bias, a, b, beta=0.5, alpha=2.0) @ a


def test_steps_in_order_run_their_parts_as_blocks_on_free_units(python_subprocess):
    """Steps that run in order (a chain: none to run side by side) still run a large product's or elementwise
    op's parts as blocks that whichever compute unit is free takes, as eager kernels do: the CPU's bits at one
    thread."""
    code = """
        import torch, my_device, my_device.compiler as mc
        torch.set_num_threads(1)
        from test_compiler import product_program
        chain, inputs, expected = product_program(512, 256)
        # (blocks of milliseconds, so that a helper slow to get a core on a loaded machine still takes some)
        before = my_device._C._test_blocks_run_by_other_units()
        for run in range(20):
            (out,) = chain.run([t.to("mydev") for t in inputs])
            assert torch.equal(out.cpu(), expected), run
        assert chain.runs_side_by_side is False, chain.dump()
        assert my_device._C._test_blocks_run_by_other_units() > before
        # Elementwise steps by ranges of elements, which start where a vector loop's step does, and the last
        # with the whole's tail: the same bits.
        shape = "Float[601,509]{509,1}+0"
        x, grad = torch.randn(601, 509) * 3, torch.randn(601, 509)
        for call, expected in (("aten::gelu(%1, s\\"none\\")", torch.nn.functional.gelu(x)),
                               ("aten::gelu_backward(%0, %1, s\\"none\\")", torch.ops.aten.gelu_backward(grad, x)),
                               ("my_device::gelu_backward(%0, %1, s\\"none\\")", torch.ops.aten.gelu_backward(grad, x))):
            one = mc.compile(f"program one\\ninput %0 : {shape}\\ninput %1 : {shape}\\n%2 = {call} : {shape}\\n"
                             f"output %2\\n")
            assert one.dump().count("in 2 parts") == 1, one.dump()
            before = my_device._C._test_blocks_run_by_other_units()
            for run in range(20):
                (out,) = one.run([grad.to("mydev"), x.to("mydev")])
                assert torch.equal(out.cpu(), expected), (call, run)
            assert my_device._C._test_blocks_run_by_other_units() > before, call
        print("ok")
    """
    result = python_subprocess(code, env={"MYDEV_COMPUTE_UNITS": "", "PYTHONPATH": "test"}, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1:] == ["ok"], result.stdout


def test_independent_steps_share_the_compute_units(python_subprocess):
    """Steps that touch no memory another writes run side by side on the device's compute units (forced here
    with MYDEV_COMPUTE_UNITS=2; by default the first runs decide): the results, a failing step's report and
    training stay eager's."""
    code = """
        import copy, torch, my_device, my_device.compiler as mc
        shape = "Float[48,48]{48,1}+0"
        pair = mc.compile(f\"\"\"program pair
        input %0 : {shape}
        input %1 : {shape}
        %2 = aten::mm(%0, %1) : {shape}
        %3 = aten::mm(%1, %0) : {shape}
        %4 = aten::mm(%2, %3) : {shape}
        output %4
        \"\"\".replace("        ", ""))
        x, y = torch.randn(48, 48) / 8, torch.randn(48, 48) / 8
        for _ in range(3):
            (out,) = pair.run([x.to("mydev"), y.to("mydev")])
            torch.testing.assert_close(out.cpu(), (x @ y) @ (y @ x))
        assert pair.runs_side_by_side is True, pair.dump()
        from test_compiler import product_program
        product, inputs, expected = product_program(256, 128)
        for _ in range(3):
            (out,) = product.run([t.to("mydev") for t in inputs])
            torch.testing.assert_close(out.cpu(), expected)
        assert product.runs_side_by_side is True, product.dump()
        chain = mc.compile(f"program chain\\ninput %0 : {shape}\\n%1 = aten::mm(%0, %0) : {shape}\\n"
                           f"%2 = aten::mm(%1, %1) : {shape}\\noutput %2\\n")
        assert chain.runs_side_by_side is False, chain.dump()
        failing = mc.compile(\"\"\"program gather_beside
        input %0 : Float[4]{1}+0
        input %1 : Long[2]{1}+0
        %2 = aten::mul.Tensor(%0, %0) : Float[4]{1}+0
        %3 = aten::gather(%0, i0, %1, b0) : Float[2]{1}+0
        %4 = aten::exp(%0) : Float[4]{1}+0
        output %2 %3 %4
        \"\"\".replace("        ", ""))
        v = torch.arange(4.0, device="mydev")
        outs = failing.run([v, torch.tensor([0, 9], device="mydev")])
        try:
            torch.mydev.synchronize()
            raise AssertionError("no error")
        except RuntimeError as e:
            assert "gather_beside: aten::gather (line 5)" in str(e) and "out of bounds" in str(e), e
        assert all(o.cpu().eq(0).all() for o in outs), outs
        assert v.tolist() == [0.0, 1.0, 2.0, 3.0]
        from test_compiler import gradients_equal_eager
        torch.manual_seed(0)
        # a convolution and a pooling in parts by samples, a convolution's backward as two calls
        dumps = gradients_equal_eager(torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 32, 3, padding=1)
        ).to("mydev"), torch.randn(8, 3, 32, 32, device="mydev"))
        assert "max_pool2d_with_indices (line" in dumps and dumps.count("in 2 parts") >= 3, dumps
        assert any("aten::convolution (line" in line and "in 2 parts" in line for line in dumps.splitlines()), dumps
        # attention in parts by samples, forward and backward
        dumps = gradients_equal_eager(torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
                                      .to("mydev"), torch.randn(8, 32, 64, device="mydev"))
        assert dumps.count("flash_attention_for_cpu") >= 2 and all(
            "in 2 parts" in line for line in dumps.splitlines() if line.startswith("step") and "attention" in line), dumps
        print("ok")
    """
    result = python_subprocess(code, env={"MYDEV_COMPUTE_UNITS": "2", "PYTHONPATH": "test"}, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1:] == ["ok"], result.stdout


def test_units_side_by_side_share_the_intra_op_threads_and_a_step_run_alone_has_them_all(python_subprocess):
    """Two units running steps side by side each get their share of torch's intra-op threads (OpenMP's and MKL's
    per-thread settings); a step the other units wait for gets them all. A probe op reports what its step saw."""
    code = """
        import os, torch, my_device, my_device.compiler as mc
        lib = torch.library.Library("probe", "DEF")
        lib.define("threads(Tensor x) -> Tensor")
        for key in ("CPU", "Meta"):
            lib.impl("threads", lambda x: torch.full_like(x, torch.get_num_threads()), key)
        t = "Float[4]{1}+0"
        p = mc.compile(f"program share\\ninput %0 : {t}\\ninput %1 : {t}\\n%2 = probe::threads(%0) : {t}\\n"
                       f"%3 = probe::threads(%1) : {t}\\n%4 = aten::add.Tensor(%2, %3, i1) : {t}\\n"
                       f"%5 = probe::threads(%4) : {t}\\noutput %2 %3 %5\\n")
        # (a stream's worker takes torch's setting at its first kernel, so one setting a process)
        threads = int(os.environ["THREADS"])
        torch.set_num_threads(threads)
        for _ in range(5):
            first, second, last = (o.cpu()[0].item() for o in p.run([torch.zeros(4, device="mydev")] * 2))
            # the first step starts with the second ready beside it; the second may find the other unit
            # busy elsewhere, and then runs alone; the last waits for both
            assert first == max(1, threads // 2) and second in (first, threads) and last == threads, (
                threads, first, second, last)
        assert p.runs_side_by_side is True
        print("ok")
    """
    for threads in ("2", "1", "4"):
        # (MYDEV_KERNEL_THREADS=torch: kernels take torch's setting as it is, which may ask for every core)
        result = python_subprocess(code, env={"MYDEV_COMPUTE_UNITS": "2", "THREADS": threads,
                                              "MYDEV_KERNEL_THREADS": "torch"}, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split()[-1:] == ["ok"], result.stdout


def test_the_first_runs_time_both_ways_and_the_faster_stays(python_subprocess):
    """Whether a program's steps run side by side is measured: after its first run, runs in order and then as
    many side by side are timed, and side by side stays only if it was faster. A probe op sleeps: two naps
    side by side take half the time of two in a row; two naps that must take turns (a lock) gain nothing; a
    chain has no steps to run side by side and is decided from its build."""
    code = """
        import os, threading, time
        os.environ.pop("MYDEV_COMPUTE_UNITS", None)
        import torch, my_device, my_device.compiler as mc
        lib = torch.library.Library("probe", "DEF")
        lib.define("nap(Tensor x, float seconds) -> Tensor")
        lib.define("nap_in_turn(Tensor x, float seconds) -> Tensor")
        turn = threading.Lock()
        def nap(x, seconds):
            time.sleep(seconds)
            return x + 1
        def nap_in_turn(x, seconds):
            with turn:
                return nap(x, seconds)
        for name, fn in (("nap", nap), ("nap_in_turn", nap_in_turn)):
            lib.impl(name, fn, "CPU")
            lib.impl(name, lambda x, seconds: torch.empty_like(x), "Meta")
        t = "Float[4]{1}+0"
        def program(op, seconds):
            return mc.compile(f"program {op}\\ninput %0 : {t}\\ninput %1 : {t}\\n%2 = probe::{op}(%0, f{seconds}) : {t}\\n"
                              f"%3 = probe::{op}(%1, f{seconds}) : {t}\\n%4 = aten::add.Tensor(%2, %3, i1) : {t}\\n"
                              f"output %4\\n")
        free, in_turn = program("nap", 0.01), program("nap_in_turn", 0.02)
        chain = mc.compile(f"program chain\\ninput %0 : {t}\\n%1 = probe::nap(%0, f0.001) : {t}\\n"
                           f"%2 = probe::nap(%1, f0.001) : {t}\\noutput %2\\n")
        assert chain.runs_side_by_side is False, chain.dump()
        x = torch.arange(4.0)
        deciding = 1 + 2 * 5  # the first run, then five in order and five side by side
        for run in range(deciding + 2):
            for p in (free, in_turn):
                (out,) = p.run([x.to("mydev"), x.to("mydev")])
                assert out.cpu().tolist() == (2 * x + 2).tolist()
                torch.mydev.synchronize()
                assert (p.runs_side_by_side is None) == (run < deciding - 1), (run, p.dump())
        assert free.runs_side_by_side is True, free.dump()
        assert in_turn.runs_side_by_side is False, in_turn.dump()
        print("ok")
    """
    result = python_subprocess(code, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1:] == ["ok"], result.stdout


def test_relu_backward_reads_its_zero_as_a_number():
    """aot_autograd writes relu's backward as where(x <= 0, scalar_tensor(0), grad): the 0-dim tensor becomes a
    constant of the fused kernel (fold_scalar_fills), not a call, and the gradients stay eager's."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(DEV)
    twin = copy.deepcopy(net)
    compiled = torch.compile(twin, backend="mydev")
    x = torch.randn(5, 8, device=DEV)
    for m in (net, compiled):
        m(x).square().sum().backward()
    for p, q in zip(net.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad)
    dumps = mc.dump(2)
    assert "aten::where.self" in dumps and "aten::scalar_tensor" not in dumps, dumps


def test_a_tensor_taken_apart_gets_its_gradient_as_one_cat():
    """The gradient of q, k, v = proj[0], proj[1], proj[2] is the three gradients side by side
    (stack_select_backward_sums), not three zero-filled tensors added; gradients stay eager's. A part
    used twice or an index missing keeps the sum."""
    torch.manual_seed(0)

    def parts(x, w):
        p = (x @ w).unflatten(-1, (3, 4)).movedim(-2, 0)
        return p[0] * p[1] + p[2] * 2

    def part_missing(x, w):
        p = (x @ w).unflatten(-1, (3, 4)).movedim(-2, 0)
        return p[0] * p[2]

    for fn, cats in ((parts, True), (part_missing, False)):
        torch._dynamo.reset()
        x, w = torch.randn(5, 6), torch.randn(6, 12)
        grads = []
        for f in (fn, torch.compile(fn, backend="mydev")):
            xd, wd = x.to(DEV).requires_grad_(), w.to(DEV).requires_grad_()
            f(xd, wd).square().sum().backward()
            grads.append((xd.grad, wd.grad))
        for eager, compiled in zip(*grads):
            torch.testing.assert_close(compiled, eager)
        backward = mc.dump(1)
        assert ("aten::cat" in backward and "select_backward" not in backward) == cats, backward


def test_text_form_round_trips():
    text = ('program p\ninput %0 : Float[2,3]{3,1}+0\n'
            '%1, %2 = aten::var_mean.correction(%0, [i1], n, b1) : Float[2,1]{1,1}+0, Float[2,1]{1,1}+0\n'
            '%3 = aten::full([i2], f-inf, t"Float", n, d"mydev:0", b0) : Float[2]{1}+0 @ "model.py:3"\n'
            'output %1 %2 %3\n')
    normal = my_device._C._compiler.parse(text)
    assert my_device._C._compiler.parse(normal) == normal
    assert 'model.py:3' in normal
    x = torch.randn(2, 3)
    var, mean, full = mc.compile(text).run([x.to(DEV)])
    torch.testing.assert_close(var.cpu(), x.var(1, keepdim=True))
    torch.testing.assert_close(mean.cpu(), x.mean(1, keepdim=True))
    assert full.device.type == DEV and full.cpu().tolist() == [float("-inf")] * 2


def compiled_training_in_strict_mode(python_subprocess, backend, check=""):
    """Forward and backward of a small MLP compiled with `backend`, in a process with MYDEV_STRICT=1
    (any host access to device memory crashes), against CPU; `check` is more code run at the end."""
    r = python_subprocess(f"""
import torch, my_device
from torch import nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
x = torch.randn(3, 8)
ref = m(x); ref.sum().backward()
grads = [p.grad.clone() for p in m.parameters()]
m.zero_grad()
md = m.to("mydev")
out = torch.compile(md, backend={backend!r})(x.to("mydev"))
out.sum().backward()
torch.testing.assert_close(out.cpu(), ref)
for p, g in zip(md.parameters(), grads):
    torch.testing.assert_close(p.grad.cpu(), g)
{check}
print("ok")
""", env={"MYDEV_STRICT": "1"}, timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


@pytest.mark.slow
def test_strict_mode(python_subprocess):
    compiled_training_in_strict_mode(python_subprocess, "mydev", check=(
        "import my_device.compiler as mc\n"
        "assert mc.counters()['fused_groups'] >= 1 and mc.counters()['graphs_eager'] == 0"))


def test_backend_is_listed():
    assert "mydev" in torch._dynamo.list_backends()


def test_optimizer_step_with_cpu_step_counts_compiles():
    # AdamW with capturable=False keeps its step counts on the CPU; the ops on them run on the
    # host before the program (graph_module.split_host_prologue), the rest is one launch.
    mc.reset_counters()
    opt = _train_with_compiled_step(lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    assert all(s["step"].device.type == "cpu" and s["step"].item() == 3 for s in opt.state.values())
    assert mc.counters()["graphs_eager"] == 0 and mc.counters()["graphs_compiled"] >= 1


def _train_with_compiled_step(make_opt, steps=3):
    """Trains a small model `steps` times on CPU with an eager optimizer and on mydev with its step
    compiled by backend="mydev"; checks the parameters agree and returns the mydev optimizer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    x, target = torch.randn(4, 16), torch.randint(0, 4, (4,))
    params = {}
    for dev, backend in (("cpu", None), (DEV, "mydev")):
        torch._dynamo.reset()
        m = copy.deepcopy(model).to(dev)
        opt = make_opt(m.parameters())
        step = torch.compile(opt.step, backend=backend) if backend else opt.step
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(m(x.to(dev)), target.to(dev)).backward()
            step()
        params[dev] = [p.detach().cpu() for p in m.parameters()]
    for a, b in zip(params["cpu"], params[DEV]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    return opt


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=1e-3),
    lambda ps: torch.optim.Adam(ps, lr=1e-2),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
], ids=["sgd_momentum", "adam", "adamw"])
def test_compiled_optimizer_fuses_each_parameters_update(make_opt):
    # The optimizers' foreach calls are traced per tensor (dynamo.decompositions) and reordered so
    # each parameter's chain is contiguous (graph_module.cluster_pointwise_chains): the update
    # is fused kernels only, not one generic call per list op.
    opt = _train_with_compiled_step(make_opt)
    updates = [g for g in mc.last_graphs(16) if "inference" in g.name]
    assert updates, "the optimizer step was not compiled"
    text = updates[-1].dump()
    assert "_foreach_" not in text.split("# ")[-1]  # no step calls a list op
    summary = next(line for line in text.splitlines() if line.startswith("# ") and "steps (" in line)
    kernels = int(summary.split(" into ")[1].split(" kernels")[0])
    n_params = sum(len(g["params"]) for g in opt.param_groups)
    assert " 0 calls" in summary and kernels <= 2 * n_params, summary


@pytest.mark.parametrize("weight", [0.1, 0.5, 0.9, -0.2])
def test_lerp_with_a_number_weight_is_fused_arithmetic_with_eager_results(weight):
    torch.manual_seed(0)
    a, b = torch.randn(64), torch.randn(64)
    f = torch.compile(lambda x, y: torch.lerp(x, y, weight) * 2, backend="mydev")
    got = f(a.to(DEV), b.to(DEV)).cpu()
    torch.testing.assert_close(got, torch.lerp(a, b, weight) * 2, rtol=1e-6, atol=1e-6)
    summary = next(line for line in mc.last_graphs(1)[-1].dump().splitlines() if "steps (" in line)
    assert " 0 calls" in summary, summary  # one fused kernel, no fill


def test_graph_passes_keep_results_and_group_chains():
    from my_device.compiler.graph_module import cluster_pointwise_chains, fold_scalar_fills
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(p0, p1, g0, g1):
        # Two parameters' updates interleaved op by op, as a decomposed foreach call traces.
        d0, d1 = g0 - p0, g1 - p1
        w0, w1 = torch.full_like(d0, 0.25) * 2, torch.full_like(d1, 0.25) * 2
        s0, s1 = p1 * 3, p0 * 3  # chain heads reading graph inputs only
        return (d0 * w0 + p0).sqrt() + s1, (d1 * w1 + p1).exp() + s0

    args = [torch.rand(8, 4), torch.rand(3), torch.rand(8, 4), torch.rand(3)]
    gm = make_fx(fn)(*args)
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    FakeTensorProp(gm).propagate(*args)
    expected = gm(*args)
    gm = cluster_pointwise_chains(fold_scalar_fills(gm))
    for got, want in zip(gm(*args), expected):
        torch.testing.assert_close(got, want)
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert not any("full_like" in str(n.target) for n in ops)
    shapes = [tuple(n.meta["val"].shape) for n in ops]
    # Each shape's ops form one contiguous run.
    runs = [s for i, s in enumerate(shapes) if i == 0 or shapes[i - 1] != s]
    assert sorted(runs) == sorted(set(shapes)), shapes


@pytest.mark.parametrize("text, message", [
    ("program bad\ninput %0 : Float[4]{1}+0\n%1 = aten::mul.Scalar(%0, f2.0) : Float[4]{1}+0\n"
     "%2 = aten::as_strided(%1, [i4], [i3], i1) : Float[4]{3}+1\noutput %2\n",
     r"aten::as_strided \(line 4\) gives %2 Float\[4\]\{3\}\+1, which reaches 44 bytes of storage, but its base %1"),
    ("program bad\ninput %0 : Float[4]{-1}+0\n%1 = aten::mul.Scalar(%0, f2.0) : Float[4]{1}+0\noutput %1\n",
     r"value %0 has the geometry Float\[4\]\{-1\}\+0, which no tensor has"),
])
def test_a_program_whose_geometry_leaves_its_storage_is_refused_when_built(text, message):
    # Program text may come from a file (a saved module's lowered form); kernels trust its geometry.
    with pytest.raises(RuntimeError, match=message):
        mc.compile(text)


def test_a_view_of_an_input_beyond_its_storage_is_refused_at_run():
    program = mc.compile("program bad\ninput %0 : Float[4]{1}+0\n"
                               "%1 = aten::as_strided(%0, [i4], [i100000], n) : Float[4]{100000}+0\n"
                               "%2 = aten::mul.Scalar(%1, f2.0) : Float[4]{1}+0\noutput %2\n")
    x = torch.ones(4, device="mydev")
    with pytest.raises(RuntimeError, match="input 0 has 16 bytes of storage, but the program's views of it reach 1200004"):
        program.run([x])
    # the same view of a big enough storage is fine, and the device still works
    big = torch.arange(400004.0, device="mydev")[:4]
    torch.testing.assert_close(program.run([big])[0].cpu(), torch.tensor([0.0, 100000.0, 200000.0, 300000.0]) * 2)


def test_empty_intermediates_in_the_arena_are_given_to_their_steps():
    # Found by `python -m my_device.conformance --frontend compile` (softmax.with_dtype's empty sample):
    # a backward program whose out= step writes an empty tensor planned in an arena of no bytes.
    x = torch.randn(5, 0, 0, requires_grad=True)
    d = x.detach().to("mydev").requires_grad_()
    f = lambda t: torch.softmax(t, -1, dtype=torch.float64)  # noqa: E731
    torch.compile(f, backend="mydev", dynamic=False)(d).sum().backward()
    f(x).sum().backward()
    torch.mydev.synchronize()
    assert d.grad.shape == x.grad.shape and d.grad.device.type == "mydev"
    torch.testing.assert_close(d.grad.cpu(), x.grad)


def test_a_reduction_of_a_0_dim_tensor_and_one_over_a_dim_it_lacks():
    # Found by `python -m my_device.conformance --frontend compile` (logsumexp of a 0-dim tensor over
    # dim 0): the fused reduction indexed the input's sizes by that dim and crashed the process.
    scalar = mc.compile("program p\ninput %0 : Float[]{}+0\n%1 = aten::exp(%0) : Float[]{}+0\n"
                        "%2 = aten::sum.dim_IntList(%1, [i0], b1, n) : Float[]{}+0\noutput %2\n")
    x = torch.tensor(0.5)
    torch.testing.assert_close(scalar.run([x.to("mydev")])[0].cpu(), torch.sum(x.exp(), (0,), True))
    beyond = mc.compile("program p\ninput %0 : Float[3]{1}+0\n%1 = aten::exp(%0) : Float[3]{1}+0\n"
                        "%2 = aten::sum.dim_IntList(%1, [i5], b0, n) : Float[]{}+0\noutput %2\n")
    with pytest.raises((IndexError, RuntimeError), match="Dimension out of range"):  # (a program's step: at the sync)
        beyond.run([torch.ones(3, device="mydev")])
        torch.mydev.synchronize()
    torch.testing.assert_close(scalar.run([x.to("mydev")])[0].cpu(), torch.sum(x.exp(), (0,), True))


@pytest.mark.parametrize("cls,shape", [(torch.nn.BatchNorm1d, (2, 3, 5)), (torch.nn.BatchNorm2d, (2, 3, 4, 4)),
                                       (torch.nn.InstanceNorm2d, (2, 3, 4, 4))])
def test_batch_norm_in_eval_mode_compiles_like_cpu(cls, shape):
    # Found by `python -m my_device.conformance --suite modules --frontend compile`: the traced graph
    # gives eval-mode batch norm's saved statistics the channel count's size, the CPU kernel a program
    # runs gives them none, and the program could not fill its outputs (graph_module.py's
    # fresh_eval_batch_norm_statistics).
    kwargs = {"track_running_stats": True} if cls is torch.nn.InstanceNorm2d else {}
    cpu = cls(3, **kwargs).eval()
    cpu.running_mean.uniform_()
    cpu.running_var.uniform_(0.5, 2)
    dev = copy.deepcopy(cpu).to("mydev")
    x = torch.randn(*shape, requires_grad=True)
    dx = x.detach().to("mydev").requires_grad_()
    out = torch.compile(dev, backend="mydev", dynamic=False)(dx)
    out.sum().backward()
    ref = cpu(x)
    ref.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    torch.testing.assert_close(dx.grad.cpu(), x.grad)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_an_out_kernel_that_resizes_its_output_runs_as_its_functional_op(reduction):
    # Found by `python -m my_device.conformance --frontend compile`: mse_loss's out= kernel sizes its output
    # as the elementwise loss before reducing into it, which planned (non-resizable) memory refused; the step
    # now runs mse_loss itself, and the refused try's resize warning does not reach the caller.
    x, y = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
    dx = x.detach().to("mydev").requires_grad_()
    f = torch.compile(lambda a, b: F.mse_loss(a, b, reduction=reduction), backend="mydev", dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):  # the first run finds out, the later ones know
            out = f(dx, y.to("mydev"))
        out.sum().backward()
        torch.mydev.synchronize()
    ref = F.mse_loss(x, y, reduction=reduction)
    ref.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    torch.testing.assert_close(dx.grad.cpu(), x.grad)


def test_a_view_of_another_dtype_than_its_base_keeps_its_own_offsets():
    # Found by `python -m my_device.conformance --frontend compile` (fft.rfft backward returns a real view of
    # a complex intermediate): the program made the view with its base's dtype, so the complex elements
    # reached past the storage.
    x = torch.randn(5, 6, 12, requires_grad=True)
    dx = x.detach().to("mydev").requires_grad_()
    out = torch.compile(lambda a: torch.fft.rfft(a), backend="mydev", dynamic=False)(dx)
    grad = torch.randn(out.shape, dtype=out.dtype)
    out.backward(grad.to("mydev"))
    ref = torch.fft.rfft(x)
    ref.backward(grad)
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    torch.testing.assert_close(dx.grad.cpu(), x.grad)
    y = torch.randn(4, 3, dtype=torch.complex64)
    imag = torch.compile(lambda a: torch.view_as_real(a * 2)[1:, :, 1], backend="mydev", dynamic=False)
    torch.testing.assert_close(imag(y.to("mydev")).cpu(), torch.view_as_real(y * 2)[1:, :, 1])


def _column_then_window(x):
    x[:, 1] += 1
    x.as_strided((2,), (4,), 1).sub_(3)
    return x


def _scalars_views_and_windows(x):
    y = (x + 1) * 2.5 - 0.5
    x.add_(1, alpha=2).mul_(y / 3)
    x[0] = 7.0
    x[:, 1] += 1
    x[:, 1:] *= 2
    x.as_strided((2,), (4,), 1).sub_(3)
    return x


@pytest.mark.parametrize("fn", [_column_then_window, _scalars_views_and_windows])
def test_in_place_writes_through_views_land_where_the_cpu_puts_them(fn):
    # Found through lazy tensors and reproduced with backend="mydev" (silent wrong values):
    # as_strided_scatter counts its storage offset from its tensor's storage, and a value placed in the
    # middle of the arena had the arena's: the window's write went elsewhere (values now get a storage of
    # their own, starting at their first byte).
    a = torch.arange(6.0).reshape(2, 3)
    want = fn(a.clone())
    torch._dynamo.reset()
    got = torch.compile(fn, backend="mydev", dynamic=False)(a.clone().to("mydev"))
    torch.testing.assert_close(got.cpu(), want)


# Program texts that disagree with their own ops (found by python -m my_device.conformance.fuzz): each is
# refused when built, naming the line, since kernels trust the text's geometry.
_HEAD = "program bad\ninput %0 : Float[4,3]{3,1}+0\n"


@pytest.mark.parametrize("body, message", [
    ("%1 = aten::neg(%0) : Float[4,4]{4,1}+0\noutput %1\n",
     r"aten::neg \(line 3\) gives %1 Float\[4,3\]\{3,1\}\+0 .* but the program says Float\[4,4\]"),
    ("%1 = aten::neg(%0) : Double[4,3]{3,1}+0\noutput %1\n", r"aten::neg \(line 3\) gives %1 Float\[4,3\]"),
    ("%1 = aten::neg(%0) : Float[0,3]{3,1}+0\noutput %1\n", r"gives %1 Float\[4,3\]"),
    ("%1 = aten::permute(%0, [i1, i0]) : Float[3,4]{1,3}+1\noutput %1\n",
     r"aten::permute \(line 3\) gives %1 Float\[3,4\]\{1,3\}\+0"),
    ("%1 = aten::permute(%0, [i0, i0]) : Float[4,4]{3,3}+0\noutput %1\n",
     r"aten::permute \(line 3\) refuses the arguments .*duplicate dims"),
    ("%1 = aten::neg(%0) : Float[4,3]{0,1}+0\noutput %1\n", r"writes %1 Float\[4,3\]\{0,1\}\+0, whose elements overlap"),
    ("%1 = aten::permute(%0, f0.5) : Float[3,4]{1,3}+0\noutput %1\n",
     r"argument 2 \('dims'\) is f0.5, which is not a int\[\]"),
    ("%1 = aten::gelu(%0, f0.01) : Float[4,3]{3,1}+0\noutput %1\n", r"argument 2 \('approximate'\)"),
    ("%1 = aten::clone(%0, i-1) : Float[4,3]{3,1}+0\noutput %1\n",
     r"argument 2 \('memory_format'\) is i-1, which is not a MemoryFormat"),
    ("%1 = aten::_to_copy(%0, i99, n, n, n, b0, n) : Float[4,3]{3,1}+0\noutput %1\n",
     r"argument 2 \('dtype'\) is i99, which is not a ScalarType"),
    ("%1 = aten::neg(%0) : Float[4,3]{3,1}+0\noutput %2147483648\n", "value id out of range"),
    ("%1 = aten::neg(%0) : Float[4611686018427387904,3]{3,1}+0\noutput %1\n", "do not fit in 64 bits"),
])
def test_a_program_that_disagrees_with_its_ops_is_refused_when_built(body, message):
    keep = torch.arange(3.0, device=DEV)
    with pytest.raises(RuntimeError, match=message):
        mc.compile(_HEAD + body)
    assert keep.tolist() == [0.0, 1.0, 2.0]


def test_where_with_a_condition_that_is_not_bool_is_refused_like_the_cpu():
    # A fused where would take any nonzero condition; the CPU kernel refuses, and so does the program.
    program = mc.compile("program w\ninput %0 : Float[3]{1}+0\ninput %1 : Float[3]{1}+0\n"
                         "%2 = aten::where.self(%0, %1, %0) : Float[3]{1}+0\noutput %2\n")
    x = torch.tensor([1.0, 0.0, 2.0], device=DEV)
    with pytest.raises(RuntimeError, match="where expected condition to be a boolean tensor"):
        program.run([x, x])
        torch.mydev.synchronize()
    torch.testing.assert_close((x * 2).cpu(), torch.tensor([2.0, 0.0, 4.0]))


@pytest.mark.parametrize("body, reference", [
    # contiguous and reshape copy a tensor they cannot view: the copy is not a view of the input's bytes.
    ("%1 = aten::t(%0) : Float[3,4]{1,3}+0\n%2 = aten::contiguous(%1, i0) : Float[3,4]{4,1}+0\n"
     "%3 = aten::mul.Scalar(%2, f2.0) : Float[3,4]{4,1}+0\noutput %3\n", lambda x: x.t().contiguous() * 2),
    ("%1 = aten::t(%0) : Float[3,4]{1,3}+0\n%2 = aten::reshape(%1, [i12]) : Float[12]{1}+0\noutput %2\n",
     lambda x: x.t().reshape(12)),
    # to() another dtype is a copy, never the input's bytes read as that dtype.
    ("%1 = aten::to.dtype(%0, t\"Double\", b0, b0, n) : Double[4,3]{3,1}+0\noutput %1\n", lambda x: x.double()),
])
def test_ops_that_view_only_when_they_can_are_copies_when_they_cannot(body, reference):
    x = torch.randn(4, 3)
    (out,) = mc.compile(_HEAD + body).run([x.to(DEV)])
    torch.testing.assert_close(out.cpu(), reference(x), rtol=0, atol=0)


def test_a_conjugate_view_keeps_its_conjugation():
    # hfft2 conjugates with aten::_conj (a view that sets the conj bit) before a clone: the program's
    # geometry cannot say "conjugated", so _conj runs as a call (it was a view that lost the bit).
    def f(t):
        return torch.fft.hfft2(t, s=[3, 10], dim=[1, 2], norm="ortho")

    x = torch.randn(5, 6, 7)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, backend="mydev")(x.to(DEV)).cpu(), f(x), rtol=1e-5, atol=1e-5)


def test_a_refused_out_call_leaves_its_planned_output_as_the_program_says():
    # mse_loss's out= kernel resizes its 0-dim output to the elementwise loss before it finds the planned
    # storage not resizable; the step then runs the functional op, and later readers of the loss must see
    # a 0-dim value (they saw [5]: a fused maximum and a permute failed, found by the fuzzer).
    program = mc.compile("program p\ninput %0 : Float[5]{1}+0\ninput %1 : Float[5]{1}+0\ninput %2 : Float[]{}+0\n"
                         "%3 = aten::mse_loss(%0, %1, i1) : Float[]{}+0\n"
                         "%4 = aten::maximum(%3, %2) : Float[]{}+0\n"
                         "%5 = aten::permute_copy(%3, []) : Float[]{}+0\noutput %4 %5\n")
    a, b, c = torch.randn(5), torch.randn(5), torch.tensor(-1.0)
    for _ in range(2):  # the first run tries out=, the second knows it is refused
        top, copy = program.run([a.to(DEV), b.to(DEV), c.to(DEV)])
        loss = F.mse_loss(a, b)
        torch.testing.assert_close(top.cpu(), torch.maximum(loss, c))
        torch.testing.assert_close(copy.cpu(), loss)


def test_batch_norm_updating_its_running_statistics_is_a_barrier():
    # batch_norm's schema does not mark running_mean/var as written; a read of them before it must run
    # before it (found by the fuzzer through a traced instance_norm: a quantile of the running mean read
    # the updated values).
    program = mc.compile("program p\ninput %0 : Float[2,3,4]{12,4,1}+0\ninput %1 : Float[3]{1}+0\n"
                         "input %2 : Float[3]{1}+0\n%3 = aten::mul.Scalar(%1, f2.0) : Float[3]{1}+0\n"
                         "%4 = aten::batch_norm(%0, n, n, %1, %2, b1, f0.5, f1e-05, b0) : Float[2,3,4]{12,4,1}+0\n"
                         "%5 = aten::add.Scalar(%1, i1, i1) : Float[3]{1}+0\noutput %3 %4 %5\n")
    x, mean, var = torch.randn(2, 3, 4), torch.randn(3), torch.rand(3) + 0.5
    dev_mean, dev_var = mean.to(DEV), var.to(DEV)
    before, out, after = program.run([x.to(DEV), dev_mean, dev_var])
    expected_before = mean * 2
    expected_out = F.batch_norm(x, mean, var, training=True, momentum=0.5)
    torch.testing.assert_close(before.cpu(), expected_before)
    torch.testing.assert_close(out.cpu(), expected_out)
    torch.testing.assert_close(dev_mean.cpu(), mean)
    torch.testing.assert_close(after.cpu(), mean + 1)


def test_a_result_laid_out_otherwise_than_its_kernel_would_is_written_by_the_functional_op():
    # narrow_copy's CPU out= kernel copies as if its output were contiguous; the program gives the result a
    # gapped layout (a valid, non-overlapping one): the functional op runs and its result is copied there.
    program = mc.compile("program p\ninput %0 : Float[5,5,5]{25,5,1}+0\n"
                         "%1 = aten::narrow_copy(%0, i1, i2, i2) : Float[5,2,5]{11,5,1}+0\n"
                         "%2 = aten::mul.Scalar(%1, f3.0) : Float[5,2,5]{10,5,1}+0\noutput %2\n")
    x = torch.randn(5, 5, 5)
    torch.testing.assert_close(program.run([x.to(DEV)])[0].cpu(), x.narrow(1, 2, 2) * 3, rtol=0, atol=0)


def test_a_result_laid_out_as_an_argument_by_a_python_meta_kernel_is_written_by_the_functional_op():
    # _log_softmax_backward_data's meta kernel (torch registers it in Python) lays its result out as its
    # gradient argument; its CPU out= kernel writes contiguously whatever the output's strides. A compiled
    # backward whose gradient came transposed got the transpose of its values (found by the fuzzer: pinv
    # through log_softmax).
    program = mc.compile("program p\ninput %0 : Float[5,5]{5,1}+0\ninput %1 : Float[5,5]{5,1}+0\n"
                         "%2 = aten::permute(%0, [i1, i0]) : Float[5,5]{1,5}+0\n"
                         "%3 = aten::_log_softmax_backward_data(%2, %1, i0, i6) : Float[5,5]{1,5}+0\noutput %3\n")
    grad, out = torch.randn(5, 5), torch.randn(5, 5).log_softmax(0)
    expected = torch._log_softmax_backward_data(grad.t(), out, 0, torch.float32)
    for _ in range(2):
        torch.testing.assert_close(program.run([grad.to(DEV), out.to(DEV)])[0].cpu(), expected, rtol=0, atol=0)


def test_an_efficient_zero_tensor_a_step_makes_is_read_as_zeros():
    # sgn's gradient is an efficient zero tensor, which has no bytes: the fused kernel after it (atanh's
    # gradient) read through a null pointer and crashed the process (found by the fuzzer).
    def f(x):
        return torch.rad2deg(torch.sgn(torch.atanh(x))) + x

    x = torch.rand(20, 20) * 0.9
    xd = x.to(DEV).requires_grad_()
    torch._dynamo.reset()
    out = torch.compile(f, backend="mydev")(xd)
    (grad,) = torch.autograd.grad(out.sum(), xd)
    x.requires_grad_()
    (want,) = torch.autograd.grad(f(x).sum(), x)
    torch.testing.assert_close(out.detach().cpu(), f(x).detach())
    torch.testing.assert_close(grad.cpu(), want)


def test_a_lone_relu_writes_its_planned_output_as_clamp_min():
    # relu has no out= kernel of its own; as on the CPU it is clamp_min(x, 0), written into the planned buffer
    # (NaN stays NaN, -0.0 stays -0.0).
    n = 1 << 17
    program = mc.compile(f"program p\ninput %0 : Float[{n}]{{1}}+0\n%1 = aten::relu(%0) : Float[{n}]{{1}}+0\n"
                         "output %1\n")
    assert "call aten::clamp_min.out" in program.dump()
    x = torch.randn(n)
    x[:3] = torch.tensor([float("nan"), -0.0, float("-inf")])
    for _ in range(2):
        got = program.run([x.to(DEV)])[0].cpu()
        assert torch.equal(got.nan_to_num(7.0), torch.relu(x).nan_to_num(7.0))
        assert torch.equal(got.signbit(), torch.relu(x).signbit())


def test_an_input_of_no_elements_is_taken_whatever_its_strides():
    program = mc.compile("program p\ninput %0 : Float[0,2,2]{4,2,1}+0\n%1 = aten::neg(%0) : Float[0,2,2]{4,2,1}+0\n"
                         "output %1\n")
    (out,) = program.run([torch.empty(0, 2, 2, device=DEV).transpose(1, 2)])
    assert out.shape == (0, 2, 2)


def test_an_out_kernel_that_lays_its_output_out_anew_gives_the_program_its_values():
    # max_unpool2d's CPU out= kernel lays its output out in its input's memory format: a channels-last
    # input made it write the planned (contiguous) output as channels-last (found by the fuzzer through
    # TorchScript). The values are moved into the program's layout, and later runs call the functional op.
    program = mc.compile("program p\ninput %0 : Float[1,2,1,2]{4,1,4,2}+0\ninput %1 : Long[1,2,1,2]{4,1,4,2}+0\n"
                         "%2 = aten::max_unpool2d(%0, %1, [i3, i6]) : Float[1,2,3,6]{36,18,6,1}+0\n"
                         "%3 = aten::mul.Scalar(%2, f2.0) : Float[1,2,3,6]{36,18,6,1}+0\noutput %3\n")
    x = torch.randn(1, 2, 1, 2).contiguous(memory_format=torch.channels_last)
    idx = torch.tensor([[[[8, 15]], [[13, 16]]]]).contiguous(memory_format=torch.channels_last)
    expected = F.max_unpool2d(x, idx, kernel_size=3, output_size=[1, 2, 3, 6]) * 2
    for _ in range(2):
        torch.testing.assert_close(program.run([x.to(DEV), idx.to(DEV)])[0].cpu(), expected, rtol=0, atol=0)


def test_a_conjugate_view_returned_by_the_program_is_conjugated():
    # ifft of a real input ends in _conj of the r2c result, which the program returns (found by the compile
    # OpInfo sweep: the values came back unconjugated).
    def f(t):
        return torch.fft.ifft(t, n=10, dim=1, norm="ortho")

    x = torch.randn(5, 6, 7)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f, backend="mydev")(x.to(DEV)).cpu(), f(x), rtol=1e-5, atol=1e-5)


def test_views_of_an_input_are_checked_from_where_the_input_starts():
    # aot_autograd's backward takes the gradients of unbind's outputs, which the trace saw as views at
    # offsets 1..4, as fresh 0-dim tensors: their views reach as far past their start as the trace's did.
    x = torch.randn(5, requires_grad=True)
    torch._dynamo.reset()
    xd = x.detach().to(DEV).requires_grad_()
    out = torch.compile(lambda t: torch.unbind(t), backend="mydev")(xd)
    (grad,) = torch.autograd.grad([o * (k + 1) for k, o in enumerate(out)], xd, [torch.ones((), device=DEV)] * 5)
    torch.testing.assert_close(grad.cpu(), torch.arange(1.0, 6.0))


def test_results_that_view_an_argument_unannotated_keep_it_alive():
    # broadcast_tensors returns views of its list's tensors, which its schema does not say: the program
    # reused amax's arena slot for mse_loss's result while cumprod still read amax through the view
    # (found by the fuzzer through a traced mse_loss). Which results alias what is the meta kernel's word.
    program = mc.compile("program p\ninput %0 : Float[]{}+0\ninput %1 : Float[]{}+0\ninput %2 : Float[2,2]{2,1}+0\n"
                         "input %3 : Float[2,3]{3,1}+0\n%4 = aten::amax(%0, [i-1], b0) : Float[]{}+0\n"
                         "%5, %6 = aten::broadcast_tensors([%4, %1]) : Float[]{}+0, Float[]{}+0\n"
                         "%7 = aten::mse_loss(%5, %6, i1) : Float[]{}+0\n"
                         "%8 = aten::addmm(%7, %2, %3, f0.2, f0.6) : Float[2,3]{3,1}+0\n"
                         "%9 = aten::cumprod(%5, i0, n) : Float[]{}+0\noutput %8 %9\n")
    x = [torch.tensor(-8.0), torch.tensor(2.0), torch.randn(2, 2), torch.randn(2, 3)]
    mm, kept = program.run([t.to(DEV) for t in x])
    assert kept.item() == -8.0
    torch.testing.assert_close(mm.cpu(), torch.addmm(F.mse_loss(x[0], x[1]), x[2], x[3], beta=0.2, alpha=0.6))


def test_an_input_without_the_bytes_of_its_geometry_is_refused():
    program = mc.compile("program p\ninput %0 : Float[4,4]{4,1}+0\n%1 = aten::neg(%0) : Float[4,4]{4,1}+0\noutput %1\n")
    zeros = torch._efficientzerotensor((4, 4), device=DEV)  # sizes and strides, no storage
    with pytest.raises(RuntimeError, match="input 0 has 0 bytes of storage, fewer than its own geometry reaches"):
        program.run([zeros])
    assert program.run([torch.ones(4, 4, device=DEV)])[0].sum().item() == -16.0


@pytest.mark.parametrize("cell", ["LSTMCell", "GRUCell"])
def test_an_op_with_no_cpu_kernel_leaves_its_graph_to_the_device_kernels(cell):
    # On a PrivateUse1 input ATen's RNN cells call the fused cell ops, which have no CPU kernel for a program
    # to run: the graph is refused when it is built and runs as mydev kernels, equal to the CPU, instead of
    # failing on the worker at its first run.
    torch.manual_seed(0)
    cpu = getattr(nn, cell)(4, 3)
    dev = copy.deepcopy(cpu).to("mydev")
    x, h = torch.randn(2, 4), torch.randn(2, 3)

    def step(m, x, h):
        out = m(x, (h, h) if cell == "LSTMCell" else h)
        return (out[0] if cell == "LSTMCell" else out).square().sum()

    want = step(cpu, x, h)
    want.backward()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = torch.compile(step, backend="mydev")(dev, x.to("mydev"), h.to("mydev"))
        got.backward()
    assert any("no CPU kernel" in str(w.message) for w in seen), [str(w.message) for w in seen]
    torch.testing.assert_close(got.cpu(), want)
    for p, q in zip(dev.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad)
