"""Inductor's C++ wrapper on mydev: torch._inductor.config.cpp_wrapper = True,
and AOTInductor packages (aoti_compile_and_package / aoti_load_package).
Each compiled model is checked against CPU eager, its kernels are queued on
the mydev stream, its extern kernels (several outputs, writing into views)
reach mydev through the dispatcher, and a package's weights are copied to
mydev once, when it is loaded."""
import copy
import json
import re
import zipfile

import pytest
import torch
from torch import nn
from torch._inductor.utils import run_and_get_code
from torch.utils._python_dispatch import TorchDispatchMode

import my_device
from conftest import delayed

DEV = "mydev"


def _mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), torch.randn(8, 16)


def _cnn():
    bn = nn.BatchNorm2d(8)
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 1.5)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), bn, nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(8 * 4 * 4, 10))
    return model.eval(), torch.randn(2, 3, 8, 8)


MODELS = {"mlp": _mlp, "cnn": _cnn}

# (Inductor's layout optimisation is on: it hands the CNN's convolutions
# channels-last inputs, whose output layout the fake kernel must predict; see
# my_device/_fake_conv_layout.py.)


class Compiled:
    def __init__(self, name):
        torch.manual_seed(0)
        model, self.x = MODELS[name]()
        self.reference = model(self.x).detach()
        self.model = copy.deepcopy(model).to(DEV)


@pytest.fixture(scope="module")
def cpp_wrapper_models():
    """Each model compiled once with the C++ wrapper: (callable, Compiled, code)."""
    built = {}
    for name in MODELS:
        c = Compiled(name)
        with torch._inductor.config.patch(cpp_wrapper=True), torch.no_grad():
            fn = torch.compile(c.model)
            with my_device.track_fallbacks() as fb:
                out, (code,) = run_and_get_code(fn, c.x.to(DEV))
        assert fb.counts() == {}
        built[name] = (fn, c, out, code)
    yield built
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def aoti_packages(tmp_path_factory):
    """Each model exported, compiled and packaged by AOTInductor, then loaded."""
    built = {}
    for name in MODELS:
        c = Compiled(name)
        exported = torch.export.export(c.model, (c.x.to(DEV),))
        path = str(tmp_path_factory.mktemp("aoti") / f"{name}.pt2")
        torch._inductor.aoti_compile_and_package(exported, package_path=path)
        built[name] = (torch._inductor.aoti_load_package(path), c, path)
    return built


@pytest.mark.parametrize("name", list(MODELS))
def test_cpp_wrapper_matches_cpu(cpp_wrapper_models, name):
    fn, c, out, code = cpp_wrapper_models[name]
    assert out.device.type == DEV
    torch.testing.assert_close(out.cpu(), c.reference)
    with torch.no_grad():
        torch.testing.assert_close(fn(c.x.to(DEV)).cpu(), c.reference)  # the compiled code again
    # kernels queued through the launch op; the device named through the
    # privateuse1 shim; extern kernels through the dispatcher, never CPU's shims
    assert "mydev_launch(&mydev_entry_cpp_fused_" in code, code
    assert "aoti_torch_device_type_privateuse1" in code or "cached_torch_device_type_privateuse1" in code
    assert 'findSchemaOrThrow("aten::addmm", "out")' in code, code
    assert "aoti_torch_cpu_" not in code and "aoti_torch_mydev_" not in code, code


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_aoti_package_matches_cpu(aoti_packages, name):
    loaded, c, _ = aoti_packages[name]
    with my_device.track_fallbacks() as fb:
        out = loaded(c.x.to(DEV))
        again = loaded(c.x.to(DEV))
    assert fb.counts() == {}
    assert out.device.type == DEV
    torch.testing.assert_close(out.cpu(), c.reference)
    torch.testing.assert_close(again.cpu(), c.reference)


def _returns_before_its_kernels_ran(run, x):
    torch.mydev.synchronize()
    stream = torch.mydev.current_stream()
    with delayed(stream):
        out = run(x)
        assert not stream.query(), "the call waited for its kernels"
    return out


def test_cpp_wrapper_kernels_are_queued(cpp_wrapper_models):
    fn, c, _, _ = cpp_wrapper_models["mlp"]
    x = c.x.to(DEV)
    with torch.no_grad():
        out = _returns_before_its_kernels_ran(fn, x)
    torch.testing.assert_close(out.cpu(), c.reference)


@pytest.mark.slow
def test_aoti_kernels_are_queued(aoti_packages):
    loaded, c, _ = aoti_packages["mlp"]
    out = _returns_before_its_kernels_ran(loaded, c.x.to(DEV))
    torch.testing.assert_close(out.cpu(), c.reference)


@pytest.mark.slow
def test_aoti_wrong_device_input_is_refused(aoti_packages):
    loaded, c, _ = aoti_packages["mlp"]
    with pytest.raises(RuntimeError, match=r"mydev model: input 0 \(\w+\) is a cpu tensor, not a mydev tensor"):
        loaded(c.x)
    torch.testing.assert_close(loaded(c.x.to(DEV)).cpu(), c.reference)  # the model and device still work


# -- weights: on mydev from load time on -----------------------------------------


class _HostToDeviceCopies(TorchDispatchMode):
    """Counts the copies from host tensors into mydev tensors that go through
    the dispatcher, as every copy the generated C++ makes does (aoti_torch_copy_)."""

    _COPIES = (torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default, torch.ops.aten._copy_from.default)

    def __init__(self):
        super().__init__()
        self.copies = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in self._COPIES:
            src = args[1] if func is torch.ops.aten.copy_.default else args[0]
            dst = args[0] if func is torch.ops.aten.copy_.default else out
            if src.device.type == "cpu" and dst.device.type == DEV:
                self.copies += 1
                self.bytes += src.numel() * src.element_size()
        return out


@pytest.mark.slow
def test_aoti_weights_are_copied_to_mydev_once_at_load(aoti_packages):
    _, c, path = aoti_packages["mlp"]
    before = torch.mydev.memory_allocated()
    with _HostToDeviceCopies() as at_load:
        loaded = torch._inductor.aoti_load_package(path)
    state = c.model.state_dict()
    weights = [state[fqn] for fqn in loaded.get_constant_fqns()]
    assert len(weights) >= 3  # (Inductor may inline a tiny weight into a kernel)
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    assert (at_load.copies, at_load.bytes) == (len(weights), nbytes)
    assert torch.mydev.memory_allocated() - before >= nbytes  # held by the loaded model

    x = c.x.to(DEV)
    with _HostToDeviceCopies() as calls:
        outs = [loaded(x) for _ in range(3)]
    assert (calls.copies, calls.bytes) == (0, 0)
    for out in outs:
        torch.testing.assert_close(out.cpu(), c.reference)


def test_aoti_weights_go_to_the_device_current_at_load(aoti_packages):
    _, c, path = aoti_packages["mlp"]
    with torch.mydev.device(1):
        before = (torch.mydev.memory_allocated(0), torch.mydev.memory_allocated(1))
        loaded = torch._inductor.aoti_load_package(path)
        assert torch.mydev.memory_allocated(0) == before[0]
        assert torch.mydev.memory_allocated(1) > before[1]
        out = loaded(c.x.to(DEV))
    assert out.device == torch.device(DEV, 1)
    torch.testing.assert_close(out.cpu(), c.reference)


def test_aoti_load_constants(aoti_packages):
    # AOTICompiledModel.load_constants: the weights are declared host tensors
    # (AOTIModelRunner.cpp says why), so AOTInductor's runtime refuses mydev
    # ones, and host ones are copied to mydev by each call.
    _, c, path = aoti_packages["mlp"]
    loaded = torch._inductor.aoti_load_package(path)
    fqns = loaded.get_constant_fqns()
    changed = copy.deepcopy(c.model).cpu()
    with torch.no_grad():
        for fqn, w in changed.state_dict().items():
            if fqn in fqns:
                w.mul_(-0.5)
    new = {fqn: w for fqn, w in changed.state_dict().items() if fqn in fqns}
    x = c.x.to(DEV)

    with pytest.raises(RuntimeError, match="update_constant_buffer"):
        loaded.load_constants({fqn: w.to(DEV) for fqn, w in new.items()}, check_full_update=True)
    torch.testing.assert_close(loaded(x).cpu(), c.reference)  # still the packaged weights, on a working device

    loaded.load_constants(new, check_full_update=True)
    with _HostToDeviceCopies() as call:
        out = loaded(x)
    assert call.copies == len(new)
    torch.testing.assert_close(out.cpu(), changed(c.x).detach())


@pytest.mark.slow
def test_aoti_weights_outside_the_library(tmp_path):
    # aot_inductor.package_constants_in_so=False: the package is loaded
    # without its weights, and a call refuses to run until it has them.
    c = Compiled("mlp")
    exported = torch.export.export(c.model, (c.x.to(DEV),))
    path = str(tmp_path / "no_weights.pt2")
    with torch._inductor.config.patch({"aot_inductor.package_constants_in_so": False}):
        torch._inductor.aoti_compile_and_package(exported, package_path=path)
    loaded = torch._inductor.aoti_load_package(path)
    x = c.x.to(DEV)
    with pytest.raises(RuntimeError, match=r"mydev model: weight [\w.]+ is not loaded"):
        loaded(x)
    state = c.model.state_dict()
    loaded.load_constants({fqn: state[fqn].cpu() for fqn in loaded.get_constant_fqns()}, check_full_update=True)
    torch.testing.assert_close(loaded(x).cpu(), c.reference)  # after the refusal, on a working device


# -- extern kernels: writing into views, several outputs ------------------------


def _package(model, args, path):
    exported = torch.export.export(model, args)
    torch._inductor.aoti_compile_and_package(exported, package_path=str(path))
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        wrapper = z.read(next(n for n in names if n.endswith(".wrapper.cpp"))).decode()
        externs = [json.loads(z.read(n)) for n in names if n.endswith(".json") and "/model/" in n]
    targets = {node["node"]["target"] for nodes in externs if isinstance(nodes, dict)
               for node in nodes.get("nodes", [])}
    return torch._inductor.aoti_load_package(str(path)), wrapper, targets


class _CatOfMatmuls(nn.Module):
    """cat's inputs are realized into slices of its output, so mm and addmm
    write into views of one buffer."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 4, bias=False)
        self.b = nn.Linear(8, 6)

    def forward(self, x):
        return torch.cat([x @ self.a.weight.t(), self.b(x), x], 1)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["cpp_wrapper", "aoti"])
def test_extern_kernels_write_into_slices_of_cat(mode, tmp_path):
    torch.manual_seed(0)
    model, x = _CatOfMatmuls(), torch.randn(5, 8)
    reference = model(x).detach()
    model = model.to(DEV)
    xd = x.to(DEV)
    with torch.no_grad():
        if mode == "cpp_wrapper":
            torch._dynamo.reset()
            with torch._inductor.config.patch(cpp_wrapper=True):
                run = torch.compile(model)
                out, (code,) = run_and_get_code(run, xd)
        else:
            run, code, targets = _package(model, (xd,), tmp_path / "cat.pt2")
            assert {"aten::mm.out", "aten::addmm.out"} <= targets, targets
            # what the proxy executor returns for a view goes to a handle of its own
            assert re.search(r"\b(buf\d+), \1_returned\}", code), code
            out = run(xd)
    # the matmuls' outputs are views of the cat's buffer, written in place
    views = re.findall(r"auto (buf\d+) = wrap_with_raii_handle_if_needed\(reinterpret_tensor_wrapper\((buf\d+)", code)
    assert len(views) >= 2 and len({base for _, base in views}) == 1, code
    for o in (out, run(xd), run(xd)):
        torch.testing.assert_close(o.cpu(), reference)


class _SeveralOutputs(nn.Module):
    """Ops with several outputs that Inductor leaves to extern kernels."""

    def forward(self, x):
        v, i = torch.topk(x, 3, dim=1)
        sv, si = torch.sort(x, dim=1, descending=True)
        m, mi = torch.max(x, dim=1)
        k, ki = torch.kthvalue(x, 2, dim=1)
        md, mdi = torch.median(x, dim=1)
        return v * 2, i, sv + 1, si, m, mi, k, ki, md, mdi


_SEVERAL = ("aten::topk", "aten::sort", "aten::kthvalue", "aten::median")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["cpp_wrapper", "aoti"])
def test_extern_kernels_with_several_outputs(mode, tmp_path):
    torch.manual_seed(0)
    x = torch.randn(6, 9)
    model = _SeveralOutputs()
    reference = model(x)
    xd = x.to(DEV)
    if mode == "cpp_wrapper":
        torch._dynamo.reset()
        with torch._inductor.config.patch(cpp_wrapper=True), my_device.track_fallbacks() as fb:
            run = torch.compile(model)
            out, (code,) = run_and_get_code(run, xd)
        # each through the dispatcher, to mydev's kernels
        for op in _SEVERAL:
            assert f'aoti_torch_call_dispatcher("{op}"' in code, (op, code)
    else:
        with my_device.track_fallbacks() as fb:
            run, _, targets = _package(model, (xd,), tmp_path / "several.pt2")
            out = run(xd)
        assert {t.split(".")[0] for t in targets} >= set(_SEVERAL), targets
        with pytest.raises(RuntimeError, match=r"input 0 \(\w+\) is a cpu tensor, not a mydev tensor"):
            run(x)  # refused; the model and the device keep working (below)
    assert fb.counts() == {}
    for o in (out, run(xd)):
        assert len(o) == len(reference)
        for got, want in zip(o, reference):
            assert got.device.type == DEV
            torch.testing.assert_close(got.cpu(), want)


def test_cpp_wrapper_training_with_several_output_backward_kernels():
    # convolution_backward and max_pool2d_with_indices return several tensors.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(36, 3))
    x = torch.randn(2, 3, 8, 8)
    on_mydev = copy.deepcopy(model).to(DEV)
    model(x).sum().backward()
    torch._dynamo.reset()
    with torch._inductor.config.patch(cpp_wrapper=True):
        run = torch.compile(on_mydev)

        def step():
            run(x.to(DEV)).sum().backward()

        _, codes = run_and_get_code(step)
    assert any('"aten::convolution_backward"' in code for code in codes), codes
    for p, q in zip(model.parameters(), on_mydev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-4)


# (A failing kernel in C++-wrapper code: test_inductor.py::test_failure_inside_a_kernel_is_reported_at_the_next_sync.)


@pytest.mark.slow
def test_aoti_package_loads_in_a_fresh_strict_process(aoti_packages, python_subprocess):
    # MYDEV_STRICT=1: any host access to device memory crashes the process.
    _, c, path = aoti_packages["cnn"]
    torch.save((c.x, c.reference), path + ".io")
    r = python_subprocess(f"""
        import torch
        x, reference = torch.load({path + '.io'!r})
        loaded = torch._inductor.aoti_load_package({path!r})
        out = loaded(x.to("mydev"))
        torch.testing.assert_close(out.cpu(), reference)
        print("ok", out.device)
    """, env={"MYDEV_STRICT": "1"}, timeout=300)
    assert r.returncode == 0 and "ok mydev:0" in r.stdout, r.stdout + r.stderr[-3000:]


def test_conv_output_layout_matches_fake_kernel():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(2, 3, 8, 8, device=DEV).to(memory_format=torch.channels_last)
    w = torch.randn(8, 3, 3, 3, device=DEV).to(memory_format=torch.channels_last)
    args = (None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    real = torch.convolution(x, w, *args)
    with FakeTensorMode() as mode:
        fake = torch.convolution(mode.from_tensor(x), mode.from_tensor(w), *args)
    assert real.stride() == fake.stride()


def test_fake_conv_layout_workaround_still_needed():
    # torch's own answer for an out-of-tree device's convolution (my_device/_fake_conv_layout.py).
    from my_device import _fake_conv_layout

    x = torch.randn(2, 3, 8, 8, device=DEV).to(memory_format=torch.channels_last)
    w = torch.randn(8, 3, 3, 3, device=DEV)
    backend = torch._C._select_conv_backend(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert _fake_conv_layout._original(x, w, backend) == torch.contiguous_format
    assert torch.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1).is_contiguous(
        memory_format=torch.channels_last)


def test_backend_name_workaround_still_needed():
    # my_device/inductor/backend.py answers "cpp" for mydev in
    # get_current_backend. When this test fails, torch names mydev's kernel
    # language itself: remove the workaround.
    import torch._inductor.utils as utils

    import my_device.inductor.backend as backend

    backend.register()
    assert getattr(utils.get_current_backend, "_torch_original", None) is not None
    assert utils.get_current_backend("mydev") == "cpp"
    assert utils.get_current_backend._torch_original("mydev") != "cpp"


def test_precompiled_header_workaround_still_needed():
    # my_device/inductor/backend.py names CPU's headers for mydev's
    # precompiled headers. When this test fails, torch no longer derives a
    # header inside torch's tree from the device type: remove the workaround.
    import os

    import torch._inductor.codecache as codecache

    import my_device.inductor.backend as backend

    backend.register()
    original = codecache._get_cpp_wrapper_header._torch_original
    header = original("mydev", aot_mode=True)
    include = os.path.join(os.path.dirname(torch.__file__), "include")
    assert not os.path.exists(os.path.join(include, header)), header
    assert os.path.exists(os.path.join(include, codecache._get_cpp_wrapper_header("mydev", aot_mode=True)))
