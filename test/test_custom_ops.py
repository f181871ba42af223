"""The my_device:: custom ops (csrc/ops/, my_device/ops.py) and the mydev override of aten::gelu's
autograd, against CPU references: independent formulas written with plain torch ops, and the same
ops' CPU kernels."""
import copy
import os

import pytest
import torch
import torch._dynamo.testing
import torch.nn.functional as F
from torch import nn
from torch.autograd import gradcheck, gradgradcheck
from torch.library import opcheck

import my_device
from my_device import ops

DEVICES = ["mydev", "cpu"]
EPS = 1e-6


# Independent references, written with plain torch ops (differentiated by PyTorch's own autograd).
def ref_rms_norm(x, w, eps=EPS):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def ref_fused_linear_gelu(x, w, b=None):
    return F.gelu(F.linear(x, w, b))


def ref_swiglu(gate, up):
    return F.silu(gate) * up


# name -> (custom op, reference, input shapes); the callables take the tensors positionally.
DIFFERENTIABLE = {
    "rms_norm": (lambda x, w: ops.rms_norm(x, w, EPS), ref_rms_norm, [(2, 3, 6), (6,)]),
    "fused_linear_gelu": (ops.fused_linear_gelu, ref_fused_linear_gelu, [(2, 3, 5), (4, 5), (4,)]),
    "fused_linear_gelu_no_bias": (ops.fused_linear_gelu, ref_fused_linear_gelu, [(3, 5), (4, 5)]),
    "fused_linear_gelu_1d_input": (ops.fused_linear_gelu, ref_fused_linear_gelu, [(5,), (4, 5), (4,)]),
    "rms_norm_1d_input": (lambda x, w: ops.rms_norm(x, w, EPS), ref_rms_norm, [(6,), (6,)]),
    "swiglu": (ops.swiglu, ref_swiglu, [(3, 4), (3, 4)]),
    # aten::gelu: on mydev its AutogradPrivateUse1 override runs.
    "gelu_override": (F.gelu, lambda x: 0.5 * x * (1 + torch.erf(x / 2 ** 0.5)), [(3, 4)]),
}


def _inputs(shapes, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=dtype).to(device).requires_grad_() for s in shapes]


@pytest.fixture(autouse=True)
def _fresh_counters():
    ops.reset_counters()
    yield


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(DIFFERENTIABLE))
def test_gradcheck_and_gradgradcheck(name, device):
    op, _, shapes = DIFFERENTIABLE[name]
    inputs = _inputs(shapes, device, torch.float64)
    assert gradcheck(op, inputs)
    assert gradgradcheck(op, inputs)


@pytest.mark.parametrize("name", list(DIFFERENTIABLE))
def test_forward_and_gradients_match_cpu(name):
    """mydev == the op's CPU kernel == the plain-torch reference, for outputs and gradients."""
    op, ref, shapes = DIFFERENTIABLE[name]
    dev_in = _inputs(shapes, "mydev", torch.float32)
    cpu_in = _inputs(shapes, "cpu", torch.float32)
    ref_in = _inputs(shapes, "cpu", torch.float32)
    dev_out, cpu_out, ref_out = op(*dev_in), op(*cpu_in), ref(*ref_in)
    assert dev_out.device.type == "mydev"
    torch.testing.assert_close(cpu_out, ref_out)
    torch.testing.assert_close(dev_out.cpu(), cpu_out)
    weight = torch.randn(ref_out.shape, generator=torch.Generator().manual_seed(1))
    dev_grads = torch.autograd.grad(dev_out, dev_in, weight.to("mydev"))
    cpu_grads = torch.autograd.grad(cpu_out, cpu_in, weight)
    ref_grads = torch.autograd.grad(ref_out, ref_in, weight)
    for d, c, r in zip(dev_grads, cpu_grads, ref_grads):
        assert d.device.type == "mydev"
        torch.testing.assert_close(c, r)
        torch.testing.assert_close(d.cpu(), c)


@pytest.mark.parametrize("name", ["rms_norm", "fused_linear_gelu", "gelu_override"])
def test_second_derivatives_match_reference(name):
    op, ref, shapes = DIFFERENTIABLE[name]
    dev_in = _inputs(shapes, "mydev", torch.float64)
    ref_in = _inputs(shapes, "cpu", torch.float64)

    def grad_norm(fn, inputs):
        grads = torch.autograd.grad(fn(*inputs).pow(2).sum(), inputs, create_graph=True)
        return torch.autograd.grad(sum(g.pow(2).sum() for g in grads), inputs)

    for d, r in zip(grad_norm(op, dev_in), grad_norm(ref, ref_in)):
        torch.testing.assert_close(d.cpu(), r)


def test_autograd_kernels_are_counted_on_mydev_only():
    shapes = {"rms_norm": [(3, 6), (6,)], "fused_linear_gelu": [(3, 5), (4, 5), (4,)]}
    for device in DEVICES:
        x, w = _inputs(shapes["rms_norm"], device, torch.float32)
        ops.rms_norm(x, w).sum().backward()
        x, w, b = _inputs(shapes["fused_linear_gelu"], device, torch.float32)
        ops.fused_linear_gelu(x, w, b).sum().backward()
        g, u = _inputs([(2, 3), (2, 3)], device, torch.float32)
        ops.swiglu(g, u).sum().backward()
        if device == "mydev":
            assert ops.counters() == {
                "rms_norm.forward": 1, "rms_norm.backward": 1,
                "fused_linear_gelu.forward": 1, "fused_linear_gelu.backward": 1,
                "swiglu.mydev": 1,
            }
            ops.reset_counters()
    assert ops.counters() == {}  # the CPU pass ran the same Functions, uncounted


def test_fused_rms_norm_backward_is_used_unless_recording_a_double_backward():
    x, w = _inputs([(4, 6), (6,)], "mydev", torch.float64)
    (gx,) = torch.autograd.grad(ops.rms_norm(x, w).sum(), [x])
    assert "rms_norm_backward.differentiable" not in ops.counters()
    (gx2,) = torch.autograd.grad(ops.rms_norm(x, w).sum(), [x], create_graph=True)
    assert ops.counters()["rms_norm_backward.differentiable"] == 1
    torch.testing.assert_close(gx2.detach(), gx)
    # The fused kernel, called directly, against the recorded (differentiable) path and the reference.
    g = torch.randn(4, 6, dtype=torch.float64, device="mydev")
    fused = torch.ops.my_device.rms_norm_backward(g, x.detach(), w.detach(), EPS)
    recorded = torch.autograd.grad(ops.rms_norm(x, w), [x, w], g, create_graph=True)
    x_ref, w_ref = x.detach().cpu().requires_grad_(), w.detach().cpu().requires_grad_()
    reference = torch.autograd.grad(ref_rms_norm(x_ref, w_ref), [x_ref, w_ref], g.cpu())
    for f, r, e in zip(fused, recorded, reference):
        torch.testing.assert_close(f, r.detach())
        torch.testing.assert_close(f.cpu(), e)


def test_gelu_autograd_override_runs_on_mydev_and_not_on_cpu():
    for approximate in ["none", "tanh"]:
        x_cpu = torch.randn(5, 7, requires_grad=True)
        F.gelu(x_cpu, approximate=approximate).sum().backward()
        assert ops.counters() == {}

        x_dev = x_cpu.detach().to("mydev").requires_grad_()
        y = F.gelu(x_dev, approximate=approximate)
        assert ops.counters() == {"gelu.forward": 1}
        y.sum().backward()
        assert ops.counters() == {"gelu.forward": 1, "gelu.backward": 1}
        torch.testing.assert_close(y.detach().cpu(), F.gelu(x_cpu.detach(), approximate=approximate))
        torch.testing.assert_close(x_dev.grad.cpu(), x_cpu.grad)
        ops.reset_counters()
    # nn.GELU reaches it too.
    nn.GELU()(torch.randn(3, device="mydev", requires_grad=True)).sum().backward()
    assert ops.counters() == {"gelu.forward": 1, "gelu.backward": 1}


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_keeps_forward_ad_and_functorch_on_mydev(approximate):
    """A C++ autograd Function supports neither; the override hands these calls to gelu's formula."""
    import torch.autograd.forward_ad as fwAD

    x = torch.randn(6, dtype=torch.float64)
    gelu = lambda t: F.gelu(t, approximate=approximate)  # noqa: E731
    for transform in [torch.func.grad(lambda t: gelu(t).sum()), torch.func.vmap(gelu)]:
        torch.testing.assert_close(transform(x.to("mydev")).cpu(), transform(x))
    tangents = []
    for device in DEVICES:
        with fwAD.dual_level():
            dual = fwAD.make_dual(x.to(device), torch.ones_like(x, device=device))
            tangents.append(fwAD.unpack_dual(gelu(dual)).tangent.cpu())
    torch.testing.assert_close(tangents[0], tangents[1])


def test_queued_gelu_backward_matches_aten():
    g, x = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    x_t = x.transpose(0, 2)  # non-contiguous input
    for approximate in ["none", "tanh"]:
        expected = torch.ops.aten.gelu_backward(g.transpose(0, 2), x_t, approximate=approximate)
        actual = torch.ops.my_device.gelu_backward(g.to("mydev").transpose(0, 2), x_t.to("mydev"),
                                                   approximate=approximate)
        torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("kernel", ["my_device::gelu_backward", "my_device::fused_adamw_"])
def test_queued_kernels_run_after_their_launch_returns(kernel):
    """gelu's mydev backward and the AdamW step are queued on the stream (launch_async): an injected
    kernel failure is not raised by the call but by the next synchronisation, naming the kernel
    (with MYDEV_LAUNCH_BLOCKING=1, by the call itself)."""
    x = torch.randn(4, 3, device="mydev", requires_grad=True)
    y = F.gelu(x).sum()
    torch.mydev.synchronize()

    def launch():
        if kernel == "my_device::gelu_backward":
            y.backward()  # through the override, whose backward launches the kernel
        else:
            ops.fused_adamw_(*[torch.zeros(5, device="mydev") for _ in range(4)], lr=0.1, beta1=0.9, beta2=0.99,
                             eps=1e-8, weight_decay=0.0, step=1)

    my_device._C._test_inject_kernel_failure(kernel)
    failure = pytest.raises(RuntimeError, match=f"{kernel}: injected failure")
    if os.environ.get("MYDEV_LAUNCH_BLOCKING") == "1":
        with failure:
            launch()
    else:
        launch()
        with failure:
            torch.mydev.synchronize()
    torch.mydev.synchronize()  # reported once; the device still works
    x.grad = None
    F.gelu(x).sum().backward()
    x_cpu = x.detach().cpu().requires_grad_()
    F.gelu(x_cpu).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad)


# ------------------------------------------------------------------ opcheck

def _opcheck_cases(device):
    def t(*shape, grad=True):
        return torch.randn(*shape, device=device, requires_grad=grad)

    adamw = dict(lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.01, step=3)
    return {
        "rms_norm": (torch.ops.my_device.rms_norm.default, (t(3, 5), t(5), EPS), {}),
        "rms_norm_backward": (torch.ops.my_device.rms_norm_backward.default, (t(3, 5), t(3, 5), t(5), EPS), {}),
        "fused_linear_gelu": (torch.ops.my_device.fused_linear_gelu.default, (t(2, 3, 5), t(4, 5), t(4)), {}),
        "fused_linear_gelu_no_bias": (torch.ops.my_device.fused_linear_gelu.default, (t(3, 5), t(4, 5), None), {}),
        "gelu_backward": (torch.ops.my_device.gelu_backward.default, (t(3, 5, grad=False), t(3, 5, grad=False)),
                          {"approximate": "tanh"}),
        "fused_adamw_": (torch.ops.my_device.fused_adamw_.default,
                         (t(6, grad=False), torch.randn(6, device=device), torch.rand(6, device=device),
                          t(6, grad=False)), adamw),
        "swiglu": (torch.ops.my_device.swiglu.default, (t(3, 4), t(3, 4)), {}),
    }


OPCHECK_NAMES = list(_opcheck_cases("cpu"))
# opcheck's test_autograd_registration raises "NYI devices other than CPU/CUDA/XPU" for any other
# device (torch/testing/_internal/optests/autograd_registration.py), so on mydev it is replaced by
# test_autograd_kernels_are_registered_for_privateuse1 below; on CPU opcheck runs it.
MYDEV_OPCHECK_UTILS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("name", OPCHECK_NAMES)
def test_opcheck_cpu(name):
    op, args, kwargs = _opcheck_cases("cpu")[name]
    result = opcheck(op, args, kwargs)
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("name", OPCHECK_NAMES)
def test_opcheck_mydev(name):
    op, args, kwargs = _opcheck_cases("mydev")[name]
    result = opcheck(op, args, kwargs, test_utils=MYDEV_OPCHECK_UTILS)
    assert result == {u: "SUCCESS" for u in MYDEV_OPCHECK_UTILS}


def test_opcheck_autograd_registration_still_rejects_mydev():
    # The reason for MYDEV_OPCHECK_UTILS. When this fails, PyTorch's check has
    # learned other devices: run the full opcheck on mydev and drop the workaround.
    op, args, kwargs = _opcheck_cases("mydev")["rms_norm"]
    with pytest.raises(Exception, match="NYI"):
        opcheck(op, args, kwargs, test_utils=("test_autograd_registration",))


def test_autograd_kernels_are_registered_for_privateuse1():
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in ["my_device::rms_norm", "my_device::rms_norm_backward", "my_device::fused_linear_gelu",
                 "aten::gelu"]:
        assert has(name, "AutogradPrivateUse1"), name
    for name in ["my_device::rms_norm", "my_device::rms_norm_backward", "my_device::fused_linear_gelu"]:
        assert has(name, "AutogradCPU"), name
    assert not has("aten::gelu", "AutogradCPU")  # CPU keeps PyTorch's (Autograd alias) kernel
    for name in ["my_device::rms_norm", "my_device::rms_norm_backward", "my_device::fused_linear_gelu",
                 "my_device::fused_adamw_", "my_device::gelu_backward", "my_device::swiglu"]:
        for key in ["PrivateUse1", "CPU", "Meta"]:
            assert has(name, key) or has(name, "CompositeExplicitAutograd"), (name, key)
    # swiglu's mydev kernel is its own, not the default one.
    assert has("my_device::swiglu", "PrivateUse1")


# ------------------------------------------------------------------ torch.compile

def _block(x, w1, b1, norm_w, wg, wu):
    h = ops.fused_linear_gelu(x, w1, b1)
    h = ops.rms_norm(h, norm_w, EPS)
    h = ops.swiglu(h @ wg.t(), F.gelu(h @ wu.t()))
    return h.pow(2).mean()


def test_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    shapes = [(3, 5), (8, 5), (8,), (8,), (6, 8), (6, 8)]
    inputs = _inputs(shapes, "mydev", torch.float32)
    eager = _block(*inputs)
    eager_grads = torch.autograd.grad(eager, inputs)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(_block, backend=counter, fullgraph=True)
    out = compiled(*inputs)
    grads = torch.autograd.grad(out, inputs)
    assert counter.frame_count == 1
    # Dynamo's graph holds the custom ops themselves (packets or overloads), not a decomposition.
    targets = {str(n.target).removesuffix(".default") for g in counter.graphs for n in g.graph.nodes
               if n.op == "call_function"}
    assert {"my_device.fused_linear_gelu", "my_device.rms_norm", "my_device.swiglu"} <= targets, targets
    torch.testing.assert_close(out, eager)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e)


def test_compiled_fused_adamw_matches_eager():
    torch._dynamo.reset()

    def step(p, m, v, g):
        ops.fused_adamw_(p, m, v, g, lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.01, step=2)

    tensors = [torch.randn(7, device="mydev") for _ in range(4)]
    tensors[2] = tensors[2].abs()  # exp_avg_sq is non-negative
    eager = [t.clone() for t in tensors]
    step(*eager)
    torch.compile(step, backend="aot_eager", fullgraph=True)(*tensors)
    for c, e in zip(tensors, eager):
        torch.testing.assert_close(c, e)


# ------------------------------------------------------------------ fused AdamW and training

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("device", DEVICES)
def test_fused_adamw_matches_torch_adamw(device, dtype):
    # 3 x 7: the float kernel's 4-lane loop and its scalar tail both run.
    torch.manual_seed(0)
    p_ref = torch.randn(3, 7, dtype=dtype, requires_grad=True)
    p = p_ref.detach().to(device).requires_grad_()
    opt_ref = torch.optim.AdamW([p_ref], lr=0.05, weight_decay=0.1, foreach=False)
    opt = ops.AdamW([p], lr=0.05, weight_decay=0.1)
    for _ in range(4):
        grad = torch.randn(3, 7, dtype=dtype)
        p_ref.grad, p.grad = grad, grad.to(device)
        opt_ref.step()
        opt.step()
        torch.testing.assert_close(p.detach().cpu(), p_ref.detach())
    state, state_ref = opt.state[p], opt_ref.state[p_ref]
    torch.testing.assert_close(state["exp_avg"].cpu(), state_ref["exp_avg"])
    torch.testing.assert_close(state["exp_avg_sq"].cpu(), state_ref["exp_avg_sq"])


class _Net(nn.Module):
    """Linear+GELU -> RMSNorm -> SwiGLU -> Linear, with the custom ops or the same math in aten ops."""

    def __init__(self, custom):
        super().__init__()
        torch.manual_seed(0)
        self.custom = custom
        self.fc1 = nn.Linear(16, 32)
        self.norm_weight = nn.Parameter(1 + 0.1 * torch.randn(32))
        self.gate = nn.Linear(32, 24, bias=False)
        self.up = nn.Linear(32, 24, bias=False)
        self.out = nn.Linear(24, 4)

    def forward(self, x):
        if self.custom:
            h = ops.fused_linear_gelu(x, self.fc1.weight, self.fc1.bias)
            h = ops.rms_norm(h, self.norm_weight, EPS)
            h = ops.swiglu(self.gate(h), self.up(h))
        else:
            h = F.gelu(self.fc1(x))
            h = ref_rms_norm(h, self.norm_weight)
            h = F.silu(self.gate(h)) * self.up(h)
        return self.out(h)


def _train(model, device, make_opt, data):
    model = copy.deepcopy(model).to(device)
    opt = make_opt(model.parameters())
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("optimizer", ["sgd", "fused_adamw"])
def test_model_on_custom_ops_trains_like_aten_model(optimizer):
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(6)]
    custom_opt = {"sgd": lambda p: torch.optim.SGD(p, lr=0.2, momentum=0.9),
                  "fused_adamw": lambda p: ops.AdamW(p, lr=1e-2)}[optimizer]
    aten_opt = {"sgd": lambda p: torch.optim.SGD(p, lr=0.2, momentum=0.9),
                "fused_adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False)}[optimizer]
    custom_dev = _train(_Net(custom=True), "mydev", custom_opt, data)
    counts = ops.counters()
    aten_dev = _train(_Net(custom=False), "mydev", aten_opt, data)
    custom_cpu = _train(_Net(custom=True), "cpu", custom_opt, data)
    assert custom_dev[-1] < custom_dev[0]
    torch.testing.assert_close(custom_dev, aten_dev, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(custom_dev, custom_cpu, rtol=1e-5, atol=1e-5)
    for event in ["fused_linear_gelu.forward", "fused_linear_gelu.backward", "rms_norm.forward",
                  "rms_norm.backward", "swiglu.mydev"]:
        assert counts[event] == len(data), event


def test_training_step_runs_with_fallback_error(python_subprocess):
    """An MLP (plain aten layers) and the custom-op model train on mydev with MYDEV_FALLBACK=error,
    so no op of the step (forward, backward, fused optimizer) goes through the copying fallback."""
    r = python_subprocess(
        """
        import torch, my_device
        from torch import nn
        import torch.nn.functional as F
        from my_device import ops
        torch.manual_seed(0)
        mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 4)).to("mydev")
        w1, b1 = torch.randn(32, 16, device="mydev", requires_grad=True), torch.zeros(32, device="mydev", requires_grad=True)
        nw = torch.ones(32, device="mydev", requires_grad=True)
        params = list(mlp.parameters()) + [w1, b1, nw]
        opts = [torch.optim.AdamW(mlp.parameters(), lr=1e-2, fused=True), ops.AdamW([w1, b1, nw], lr=1e-2)]
        x, y = torch.randn(8, 16, device="mydev"), torch.randint(0, 4, (8,), device="mydev")
        for _ in range(2):
            for o in opts:
                o.zero_grad()
            h = ops.rms_norm(ops.fused_linear_gelu(x, w1, b1), nw)
            loss = F.cross_entropy(mlp(x), y) + ops.swiglu(h, h).mean()
            loss.backward()
            for o in opts:
                o.step()
        torch.mydev.synchronize()
        assert my_device.fallback_counts() == {}, my_device.fallback_counts()
        print("ok", sorted(ops.counters()))
        """,
        env={"MYDEV_FALLBACK": "error"},
    )
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout and "'gelu.backward'" in r.stdout, r.stdout


# ------------------------------------------------------------------ errors

def _dev(*shape):
    return torch.randn(*shape, device="mydev")


BAD_CALLS = {
    "rms_norm cpu weight": (lambda: ops.rms_norm(_dev(3, 4), torch.randn(4)), "same device"),
    "rms_norm across two mydev devices": (lambda: ops.rms_norm(_dev(3, 4), _dev(4).to("mydev:1")),
                                          "same device, but found mydev:0 and mydev:1"),
    "rms_norm cpu weight, requiring grad": (
        lambda: ops.rms_norm(_dev(3, 4).requires_grad_(), torch.randn(4, requires_grad=True)), "same device"),
    "rms_norm weight shape": (lambda: ops.rms_norm(_dev(3, 4), _dev(5)), r"weight must have shape \[4\]"),
    "rms_norm dtype": (lambda: ops.rms_norm(_dev(3, 4), _dev(4).double()), "same dtype"),
    "fused_linear_gelu cpu input": (lambda: ops.fused_linear_gelu(torch.randn(3, 4), _dev(2, 4), _dev(2)),
                                    "same device"),
    "fused_linear_gelu in_features": (lambda: ops.fused_linear_gelu(_dev(3, 4), _dev(2, 5)),
                                      r"last dimension \(4\) must equal weight's in_features \(5\)"),
    "fused_linear_gelu bias": (lambda: ops.fused_linear_gelu(_dev(3, 4), _dev(2, 4), _dev(3)),
                               r"bias must have shape \[2\]"),
    "fused_linear_gelu 1-D weight": (lambda: ops.fused_linear_gelu(_dev(3, 4), _dev(4)), "weight must be 2-D"),
    "fused_adamw_ cpu grad": (lambda: ops.fused_adamw_(_dev(3), _dev(3), _dev(3), torch.randn(3), lr=0.1,
                                                       beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0, step=1),
                              "same device"),
    "fused_adamw_ shape": (lambda: ops.fused_adamw_(_dev(3), _dev(4), _dev(3), _dev(3), lr=0.1, beta1=0.9,
                                                    beta2=0.99, eps=1e-8, weight_decay=0.0, step=1),
                           "param's shape"),
    "fused_adamw_ half": (lambda: ops.fused_adamw_(*[_dev(3).half() for _ in range(4)], lr=0.1, beta1=0.9,
                                                   beta2=0.99, eps=1e-8, weight_decay=0.0, step=1),
                          "float32 or float64"),
    "fused_adamw_ step": (lambda: ops.fused_adamw_(_dev(3), _dev(3), _dev(3), _dev(3), lr=0.1, beta1=0.9,
                                                   beta2=0.99, eps=1e-8, weight_decay=0.0, step=0),
                          "step counts from 1"),
    "fused_adamw_ non-contiguous": (lambda: ops.fused_adamw_(*[_dev(3, 4).t() for _ in range(4)], lr=0.1,
                                                             beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0,
                                                             step=1),
                                    "contiguous"),
    "gelu_backward shape": (lambda: torch.ops.my_device.gelu_backward(_dev(3), _dev(4)), "grad_output has shape"),
    "swiglu shape": (lambda: ops.swiglu(_dev(3, 4), _dev(4, 3)), "same shape"),
    "swiglu cpu up": (lambda: ops.swiglu(_dev(3), torch.randn(3)), "same device"),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_bad_input_raises_clear_error_and_device_still_works(name):
    call, message = BAD_CALLS[name]
    with pytest.raises(RuntimeError, match=message):
        call()
    torch.mydev.synchronize()  # no asynchronous failure was left behind
    x, w = torch.randn(3, 4), torch.randn(4)
    torch.testing.assert_close(ops.rms_norm(x.to("mydev"), w.to("mydev")).cpu(), ref_rms_norm(x, w))
