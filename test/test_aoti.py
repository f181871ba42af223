"""Inductor's C++ wrapper on mydev: torch._inductor.config.cpp_wrapper = True,
and AOTInductor packages (aoti_compile_and_package / aoti_load_package).
Each compiled model is checked against CPU eager, its kernels are queued on
the mydev stream, and its extern kernels reach mydev through the dispatcher."""
import copy

import pytest
import torch
from torch import nn
from torch._inductor.utils import run_and_get_code

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


def test_aoti_kernels_are_queued(aoti_packages):
    loaded, c, _ = aoti_packages["mlp"]
    out = _returns_before_its_kernels_ran(loaded, c.x.to(DEV))
    torch.testing.assert_close(out.cpu(), c.reference)


def test_aoti_wrong_device_input_is_refused(aoti_packages):
    loaded, c, _ = aoti_packages["mlp"]
    with pytest.raises(RuntimeError, match=r"mydev model: input 0 \(\w+\) is a cpu tensor, not a mydev tensor"):
        loaded(c.x)
    torch.testing.assert_close(loaded(c.x.to(DEV)).cpu(), c.reference)  # the model and device still work


# (A failing kernel in C++-wrapper code: test_inductor.py::test_failure_inside_a_kernel_is_reported_at_the_next_sync.)


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
    assert getattr(utils.get_current_backend, "_mydev_workaround", False)
    assert utils.get_current_backend("mydev") == "cpp"
    assert utils.get_current_backend._original("mydev") != "cpp"


def test_precompiled_header_workaround_still_needed():
    # my_device/inductor/backend.py names CPU's headers for mydev's
    # precompiled headers. When this test fails, torch no longer derives a
    # header inside torch's tree from the device type: remove the workaround.
    import os

    import torch._inductor.codecache as codecache

    import my_device.inductor.backend as backend

    backend.register()
    original = codecache._get_cpp_wrapper_header._original
    header = original("mydev", aot_mode=True)
    include = os.path.join(os.path.dirname(torch.__file__), "include")
    assert not os.path.exists(os.path.join(include, header)), header
    assert os.path.exists(os.path.join(include, codecache._get_cpp_wrapper_header("mydev", aot_mode=True)))
