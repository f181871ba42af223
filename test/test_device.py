"""The mydev device: tensors, views, devices, and bad input. Every value is checked against CPU."""
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

import my_device

IMPL = "my_device::MyDevTensorImpl"


def test_round_trip_and_print():
    x = torch.randn(3, 4)
    d = x.to("mydev")
    assert d.device == torch.device("mydev:0")
    assert d.is_mydev and not x.is_mydev
    torch.testing.assert_close(d.cpu(), x, rtol=0, atol=0)
    text = repr(d)
    assert "device='mydev:0'" in text
    assert repr(x).split("\n")[0][:20] == text.split("\n")[0][:20]


def test_generated_methods():
    x = torch.arange(6.0)
    assert x.mydev().device.type == "mydev"
    m = torch.nn.Linear(2, 2).mydev()
    assert all(p.device.type == "mydev" for p in m.parameters())
    s = x.untyped_storage().mydev()
    assert s.device.type == "mydev"


@pytest.mark.parametrize("make", [
    lambda: torch.empty(2, 3, device="mydev"),
    lambda: torch.zeros(2, 3, device="mydev"),
    lambda: torch.randn(2, 3, device="mydev"),
    lambda: torch.arange(6, device="mydev"),
    lambda: torch.randn(2, 3).to("mydev"),
    lambda: torch.randn(2, 3, device="mydev") + 1,
    lambda: torch.randn(2, 3, device="mydev").t(),
    lambda: torch.randn(2, 3, device="mydev")[1],
    lambda: torch.randn(2, 3, device="mydev").view(6),
    lambda: torch.randn(2, 3, device="mydev").reshape(3, 2),
    lambda: torch.randn(2, 3, device="mydev").unfold(1, 2, 1),
    lambda: torch.randn(2, 3, device="mydev").view(torch.int32),
    lambda: torch.view_as_real(torch.randn(2, 3, dtype=torch.complex64, device="mydev")),
    lambda: torch.randn(2, 3, device="mydev").expand(4, 2, 3),
    lambda: torch.randn(2, 3, device="mydev").detach(),
    lambda: torch.randn(2, 3, device="mydev").clone(),
    lambda: torch.randn(2, 3, device="mydev").split(1)[0],
    lambda: torch.empty(0, device="mydev").set_(torch.randn(4, device="mydev")),
    lambda: torch.empty(0, device="mydev").resize_(5),
], ids=lambda f: "")
def test_every_tensor_is_a_mydev_impl(make):
    assert my_device.impl_type_name(make()) == IMPL


def test_views_alias():
    base_cpu = torch.arange(12.0).reshape(3, 4)
    base = base_cpu.to("mydev")
    v = base[1:, 1:3]
    assert v.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert v.storage_offset() == 5 and v.stride() == (4, 1)
    assert torch._C._is_alias_of(base, v)
    v.fill_(-1.0)
    v.mul_(3)
    base_cpu[1:, 1:3].fill_(-1.0).mul_(3)
    torch.testing.assert_close(base.cpu(), base_cpu)
    t = base.t()
    t[0, 2] = 7.0
    base_cpu.t()[0, 2] = 7.0
    torch.testing.assert_close(base.cpu(), base_cpu)
    assert not torch._C._is_alias_of(base, base.clone())


def test_view_dtype_and_complex_views_share_bytes():
    x = torch.randn(4, 6)
    d = x.to("mydev")
    torch.testing.assert_close(d.view(torch.int32).cpu(), x.view(torch.int32), rtol=0, atol=0)
    c = torch.view_as_complex(d.view(4, 3, 2))
    torch.testing.assert_close(c.cpu(), torch.view_as_complex(x.view(4, 3, 2)))
    torch.view_as_real(c)[0, 0, 0] = 100.0
    assert d[0, 0].item() == 100.0


def test_copies_every_direction():
    x = torch.randn(5, 7)
    d = x.to("mydev")
    torch.testing.assert_close(d.to(torch.float64).cpu(), x.double())         # dtype-converting on device
    torch.testing.assert_close(x.t().to("mydev").cpu(), x.t())                # non-contiguous H2D
    torch.testing.assert_close(d.t().cpu(), x.t())                            # non-contiguous D2H
    out = torch.empty(7, 5, dtype=torch.float64)
    out.copy_(d.t())                                                          # D2H into a strided dtype
    torch.testing.assert_close(out, x.t().double())
    dst = torch.zeros(7, 5, device="mydev").t()
    dst.copy_(x)                                                              # H2D into a strided view
    torch.testing.assert_close(dst.cpu(), x)
    d1 = d.to("mydev:1")                                                      # cross-device
    assert d1.device == torch.device("mydev:1")
    torch.testing.assert_close(d1.cpu(), x)
    torch.testing.assert_close(d.t().to("mydev:1").cpu(), x.t())              # cross-device strided
    torch.testing.assert_close(d.to("mydev:1", torch.int64).cpu(), x.long())  # cross-device converting


def test_copies_of_conjugated_and_negated_views():
    # these once recursed forever: the Conjugate fallback cloned into mydev, which copied, which cloned...
    z = torch.randn(4, 3, dtype=torch.complex64)
    d = z.to("mydev")
    cases = [lambda t: t.conj().resolve_conj(), lambda t: t.conj().clone(), lambda t: t * t.conj(),
             lambda t: torch._neg_view(t).clone(), lambda t: t.conj().t().contiguous()]
    for f in cases:
        torch.testing.assert_close(f(d).cpu(), f(z))
    torch.testing.assert_close(z.conj().to("mydev").cpu(), z.conj())         # H2D of a conjugated view
    torch.testing.assert_close(d.conj().cpu(), z.conj())                      # D2H of one
    torch.testing.assert_close(d.conj().to("mydev:1").cpu(), z.conj())        # cross-device
    dst = torch.empty(4, 3, dtype=torch.complex64, device="mydev")
    dst.copy_(d.conj())
    torch.testing.assert_close(dst.cpu(), z.conj())


def test_scalars_and_fill():
    d = torch.zeros(3, device="mydev")
    d.fill_(2.5)
    assert d.sum().item() == 7.5
    d.zero_()
    assert d.abs().max().item() == 0.0
    assert torch.tensor(3, device="mydev").item() == 3


def test_resize_and_set_keep_values():
    d = torch.arange(4.0, device="mydev")
    d.resize_(2, 4)
    torch.testing.assert_close(d[0].cpu(), torch.arange(4.0))
    src = torch.arange(10.0, device="mydev")
    e = torch.empty(0, device="mydev")
    e.set_(src.untyped_storage(), 2, (2, 3), (3, 1))
    torch.testing.assert_close(e.cpu(), torch.arange(10.0).as_strided((2, 3), (3, 1), 2))
    e.add_(1)
    assert src[2].item() == 3.0


def test_multi_device_and_device_context():
    assert torch.mydev.device_count() == 2
    x = torch.randn(3)
    a = x.to("mydev:1")
    assert a.device.index == 1 and a.get_device() == 1
    torch.testing.assert_close((a * 2).cpu(), x * 2)
    assert (a * 2).device.index == 1
    assert torch.mydev.current_device() == 0
    with torch.mydev.device(1):
        assert torch.mydev.current_device() == 1
        assert torch.empty(1, device="mydev").device.index == 1
    assert torch.mydev.current_device() == 0
    with pytest.raises(ZeroDivisionError):
        with torch.mydev.device(1):
            1 / 0
    assert torch.mydev.current_device() == 0


def test_torch_accelerator():
    assert torch.accelerator.current_accelerator() == torch.device("mydev")
    assert torch.accelerator.device_count() == 2
    torch.accelerator.set_device_index(1)
    try:
        assert torch.accelerator.current_device_index() == 1
        assert torch.mydev.current_device() == 1
    finally:
        torch.accelerator.set_device_index(0)
    torch.accelerator.synchronize()
    torch.mydev.synchronize()


def test_mixing_devices_raises_and_loses_nothing():
    a = torch.randn(3, device="mydev")
    kept = a.cpu()
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.randn(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.randn(3, device="mydev:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.mm(torch.randn(3, 3, device="mydev"), torch.randn(3, 3))
    # 0-dim CPU tensors are scalars, as on CUDA.
    torch.testing.assert_close((a + torch.tensor(2.0)).cpu(), kept + 2)
    torch.testing.assert_close(a.cpu(), kept)


def test_invalid_device_index_raises():
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.empty(2, device="mydev:5")
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.mydev.set_device(7)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.randn(2).to("mydev:2")
    assert torch.ones(2, device="mydev").sum().item() == 2


def test_bad_index_raises_and_device_still_works():
    x = torch.arange(5.0, device="mydev")
    other = torch.ones(3, device="mydev")
    with pytest.raises(IndexError, match="index 10 is out of bounds"):
        x[10]                                  # checked on the host, at the call
    # An index tensor is read by the queued kernel, which fails: the next
    # synchronisation raises, naming the op, as CUDA's device-side assert.
    x[torch.tensor([1], device="mydev")]
    x[torch.tensor([7], device="mydev")]
    with pytest.raises(IndexError, match="aten::index.Tensor: index 7 is out of bounds for dimension 0"):
        torch.mydev.synchronize()
    torch.testing.assert_close(x.cpu(), torch.arange(5.0))
    torch.testing.assert_close(other.cpu(), torch.ones(3))
    assert (x + 1).sum().item() == 15.0


def test_unsupported_dtype_raises_clearly():
    b = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="not implemented for 'Bool'") as cpu_error:
        b @ b
    with pytest.raises(RuntimeError, match="not implemented for 'Bool'") as dev_error:
        b.to("mydev") @ b.to("mydev")
    assert str(dev_error.value) == str(cpu_error.value)
    assert torch.ones(3, device="mydev").sum().item() == 3


def test_out_of_memory_then_recovery(python_subprocess):
    r = python_subprocess("""
        import torch, my_device
        keep = torch.arange(1000, dtype=torch.float32, device="mydev")
        try:
            torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device="mydev")
        except torch.OutOfMemoryError as e:
            print("OOM:", e)
        else:
            raise SystemExit("no OOM")
        big = torch.empty(20 * 1024 * 1024, dtype=torch.uint8, device="mydev")
        try:
            torch.empty(20 * 1024 * 1024, dtype=torch.uint8, device="mydev")
            raise SystemExit("no OOM at the limit")
        except torch.OutOfMemoryError:
            pass
        del big
        again = torch.ones(20 * 1024 * 1024, dtype=torch.uint8, device="mydev")
        assert again.min().item() == 1 and again.max().item() == 1
        assert torch.equal(keep.cpu(), torch.arange(1000, dtype=torch.float32))
        print("recovered")
    """, env={"MYDEV_MEMORY_LIMIT": "32M"})
    assert r.returncode == 0, r.stderr
    assert "recovered" in r.stdout
    assert "Tried to allocate 64.00 MiB" in r.stdout and "total capacity of 32.00 MiB" in r.stdout


def test_strict_mode_catches_host_read(python_subprocess):
    code = """
        import ctypes, torch, my_device
        x = torch.arange(4.0, device="mydev") * 2     # kernels and copies work in strict mode
        assert x.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
        print("kernels ok", flush=True)
        ctypes.string_at(x.data_ptr(), 4)             # a library reading device memory on the host
        print("host read went unnoticed", flush=True)
    """
    strict = python_subprocess(code, env={"MYDEV_STRICT": "1"})
    assert "kernels ok" in strict.stdout, strict.stderr
    assert "host read went unnoticed" not in strict.stdout
    assert strict.returncode != 0
    assert "mydev strict mode" in strict.stderr
    lax = python_subprocess(code, env={"MYDEV_STRICT": "0"})
    assert "host read went unnoticed" in lax.stdout, lax.stderr


def test_strict_mode_catches_host_read_while_a_kernel_runs(python_subprocess):
    # Kernels reach device memory at its kernel address, so the device address
    # stays inaccessible to host code even while a kernel is running.
    code = """
        import ctypes, torch, my_device
        x = torch.arange(4.0, device="mydev") * 2
        s = torch.mydev.Stream()
        with torch.mydev.stream(s):
            my_device._C._test_launch_hold(0)             # a kernel now runs on s until released
        y = x + 1                                         # other kernels still run meanwhile
        torch.mydev.default_stream().synchronize()        # (a host copy would wait for s too)
        print("kernels ok", flush=True)
        ctypes.string_at(x.data_ptr(), 4)
        print("host read went unnoticed", flush=True)
        my_device._C._test_release_hold()
        assert y.cpu().tolist() == [1.0, 3.0, 5.0, 7.0]
    """
    strict = python_subprocess(code, env={"MYDEV_STRICT": "1"})
    assert "kernels ok" in strict.stdout, strict.stderr
    assert "host read went unnoticed" not in strict.stdout
    assert strict.returncode != 0 and "mydev strict mode" in strict.stderr, strict.stderr
    lax = python_subprocess(code, env={"MYDEV_STRICT": "0"})
    assert "host read went unnoticed" in lax.stdout, lax.stderr


@pytest.mark.slow
def test_training_sparse_and_conformance_subset_hold_in_strict_mode():
    # Every kernel must reach device memory at its kernel address; one that
    # used a device address would abort the run with the strict-mode report.
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, MYDEV_STRICT="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                        "not test_noncontiguous and not test_out and not test_variant and not test_no_copying",
                        os.path.join(here, "test_training.py"), os.path.join(here, "test_sparse.py"),
                        os.path.join(here, "test_conformance.py")],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert " passed" in r.stdout, r.stdout[-500:]


def test_use_after_fork_raises(python_subprocess):
    r = python_subprocess("""
        import os, torch, my_device
        x = torch.ones(2, device="mydev")
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                torch.mydev.current_device()
            except RuntimeError as e:
                code = 0 if "Cannot re-initialize mydev in forked subprocess" in str(e) else 4
            try:
                torch.ones(2, device="mydev")
                code = code or 5
            except RuntimeError as e:
                code = code or (0 if "forked subprocess" in str(e) else 6)
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0, os.WEXITSTATUS(status)
        assert x.sum().item() == 2
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_fork_before_init_is_fine(python_subprocess):
    r = python_subprocess("""
        import os, torch, my_device
        pid = os.fork()
        if pid == 0:
            os._exit(0 if torch.ones(2, device="mydev").sum().item() == 2 else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_autoload_makes_plain_import_torch_enough(python_subprocess):
    r = python_subprocess("""
        import torch
        print(torch.randn(2, device="mydev").device, torch.mydev.device_count())
    """)
    assert r.returncode == 0, r.stderr
    assert "mydev:0 2" in r.stdout


def test_device_count_from_env(python_subprocess):
    r = python_subprocess("import torch; print(torch.mydev.device_count())", env={"MYDEV_DEVICE_COUNT": "3"})
    assert r.stdout.strip() == "3", r.stderr


def test_cpu_allocator_is_redirect():
    # Host kernels rely on replacing PyTorch's global CPU allocator (PyTorch has
    # no per-call allocator override). If PyTorch stops honouring SetAllocator
    # for CPU, outputs would land in host memory and be copied: this notices.
    x = torch.randn(64, device="mydev")
    before = torch.mydev.memory_allocated()
    y = x.exp()
    assert torch.mydev.memory_allocated() > before
    torch.testing.assert_close(y.cpu(), x.cpu().exp())


@pytest.mark.slow
def test_exit_after_a_backward_on_mydev():
    # A script whose last statement is a backward on mydev, run on autograd's
    # device threads (MYDEV_AUTOGRAD_DEVICE_THREADS=1: by default backward runs
    # on the calling thread, where there is no race): the device thread may
    # still hold that backward's GraphTask when the interpreter finalises
    # (my_device/_exit.py). It is a race, likelier on busy cores, so
    # three exit at a time. Each is a fork of one process that imported torch
    # (which starts no device thread), so a run costs a backward and an exit,
    # not an import of torch; each child then finalises its interpreter as a
    # script would. The test below checks the hook's guarantee directly.
    code = textwrap.dedent("""
        import os, sys
        import torch, my_device
        failed = 0
        for _ in range(4):
            children = []
            for _ in range(3):
                pid = os.fork()
                if pid == 0:
                    x = torch.randn(4, 5).to("mydev").requires_grad_()
                    w = torch.randn(5, 3).to("mydev").requires_grad_()
                    torch.nn.functional.gelu(x @ w).pow(2).sum().backward()
                    sys.exit(0)
                children.append(pid)
            for pid in children:
                failed += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0
        print("failed", failed)
    """)
    env = dict(os.environ, MYDEV_AUTOGRAD_DEVICE_THREADS="1")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0 and "failed 0" in run.stdout and "terminate" not in run.stderr, (
        run.returncode, run.stdout[-500:], run.stderr[-2000:])


def test_exit_hook_leaves_no_python_object_with_the_device_threads(monkeypatch):
    # What the exit hook guarantees, checked directly: once it ran, no autograd
    # device thread holds the Python object the last backward stashed.
    import types
    import weakref

    import torch.autograd.graph

    from my_device import _exit

    class Stashed:
        pass

    stashed = Stashed()
    alive = weakref.ref(stashed)
    monkeypatch.setattr(torch.autograd.graph, "contextvars", types.SimpleNamespace(copy_context=lambda: stashed))
    x = torch.randn(4, 5, device="mydev", requires_grad=True)
    # On autograd's device thread, where the race is (by default mydev runs backward on the calling thread).
    with torch.autograd.set_multithreading_enabled(True):
        (x * 2).sum().backward()
    monkeypatch.undo()
    del stashed
    _exit.drain_autograd_device_threads()
    assert alive() is None
    assert torch.equal(x.grad.cpu(), torch.full((4, 5), 2.0))


def test_exit_is_quiet_with_grad_mode_off(python_subprocess):
    # An inference script commonly turns grad mode off for good; the exit hook's backward still runs.
    result = python_subprocess("""
import torch, my_device
x = torch.randn(3, device="mydev", requires_grad=True)
(x * 2).sum().backward()
torch.set_grad_enabled(False)
print(x.grad.sum().item())
""")
    assert result.returncode == 0 and result.stdout.split() == ["6.0"], result
    assert result.stderr.strip() == "", result.stderr


def test_backward_still_stashes_a_python_context():
    # my_device/_exit.py works around this line of torch.autograd.graph; when
    # PyTorch stops stashing a Python object per backward, the hook can go.
    import inspect

    import torch.autograd.graph

    assert '_stash_obj_in_tls("context"' in inspect.getsource(torch.autograd.graph._engine_run_backward)
