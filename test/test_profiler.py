"""torch.profiler on mydev: the device's kernels, copies and memory, as CUDA's show up.

The kernels reach torch.profiler through Kineto: my_device registers an IActivityProfiler for
PrivateUse1 (csrc/profiler/ActivityProfiler.cpp), fed by the runtime's activity tracing."""
import json

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import my_device

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("mydev")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(8, 16, device="mydev")
    return model, opt, x


def _step(model, opt, x):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def _device_events(prof):
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1 and e.name != "[memory]"]


# Ops that launch no kernel: allocations without initialisation, and reading a
# number back (a copy, reported as one). Views are found by their schema.
_NO_KERNEL = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resize_", "aten::_local_scalar_dense",
              "aten::lift_fresh", "aten::result_type"}


def _is_view(name):
    packet = getattr(torch.ops.aten, name.split("::")[1], None)
    if packet is None:
        return False
    return all(any(r.alias_info is not None and not r.alias_info.is_write for r in getattr(packet, o)._schema.returns)
               for o in packet.overloads())


def _computes(e):
    return e.name.startswith("aten::") and e.name not in _NO_KERNEL and not _is_view(e.name)


def _computing_leaf_ops(prof):
    """The aten ops the step called that compute and call no other computing aten op: each must have run
    a kernel. (A kernel run at the call, under MYDEV_LAUNCH_BLOCKING=1, calls view ops such as
    aten::resolve_conj on the profiled thread: they are its children then, and do not make it a caller.)"""
    out = []
    for e in prof.events():
        if e.device_type != DeviceType.CPU or not _computes(e):
            continue
        if any(_computes(c) for c in e.cpu_children):
            continue
        out.append(e)
    return out


def test_kineto_path_is_registered():
    assert my_device._C._kineto_profiler_registered()
    assert ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities()


def test_every_kernel_of_a_training_step_is_a_device_event():
    model, opt, x = _model()
    _step(model, opt, x)  # the momentum buffers exist from here on
    torch.mydev.synchronize()
    with profile(activities=ACTIVITIES, profile_memory=True) as prof:
        _step(model, opt, x)
    kernels = _device_events(prof)
    ops = _computing_leaf_ops(prof)
    # The step's activations and gradients are allocated on the device, and freed.
    usage = [e.device_memory_usage for e in prof.events()]
    assert any(u > 0 for u in usage) and any(u < 0 for u in usage)
    assert all(e.cpu_memory_usage == 0 for e in prof.events() if e.name == "aten::addmm")
    # Every computing op ran kernels the profiler shows, each with device time: its own, or those of
    # the op that launched it (the ops a queued kernel's Meta kernel calls at the launch run on Meta
    # tensors; ops a kernel calls while it runs at the call are part of its device work).
    def launcher(op):
        while op is not None and not op.kernels:
            op = op.cpu_parent
        return op
    # Forward, backward and the optimizer's update (a foreach op: one kernel for all parameters), at least.
    assert {"aten::addmm", "aten::relu", "aten::mm", "aten::threshold_backward", "aten::_foreach_add_"} <= \
        {launcher(e).name for e in ops if launcher(e) is not None}
    for op in ops:
        owner = launcher(op)
        assert owner is not None, op.name
        for k in owner.kernels:
            assert k.duration > 0, k.name
    # Kernels are named after the op that launched them (copies by their direction).
    for op in ops:
        if op.kernels and op.name == "aten::copy_":
            assert all(k.name == "aten::copy_" or k.name.startswith("Memcpy ") for k in op.kernels), op.kernels
        elif op.kernels:
            assert all(k.name.split(".")[0] == op.name for k in op.kernels), (op.name, op.kernels)
    # And every kernel the device ran belongs to an op.
    assert len(kernels) == sum(len(e.kernels) for e in prof.events() if e.device_type == DeviceType.CPU)
    for k in kernels:
        assert k.device_index == 0 and k.time_range.end > k.time_range.start
    # A kernel starts after the op that queued it began (host and device share one clock).
    for op in {launcher(op) for op in ops}:
        names = {k.name for k in op.kernels}
        assert any(k.name in names and k.time_range.start >= op.time_range.start for k in kernels), op.name


def test_key_averages_device_time():
    model, opt, x = _model()
    _step(model, opt, x)
    with profile(activities=ACTIVITIES) as prof:
        for _ in range(3):
            _step(model, opt, x)
    avg = {e.key: e for e in prof.key_averages()}
    assert avg["aten::addmm"].device_time_total > 0
    assert avg["aten::addmm"].count == 6
    assert avg["aten::mm"].device_time_total > 0
    table = prof.key_averages().table(sort_by="device_time_total")
    assert "aten::addmm" in table and "mydev" in table.lower()


def _chrome_trace(prof, tmp_path):
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    with open(path) as f:
        return json.load(f)["traceEvents"]


def test_kernels_name_their_stream(tmp_path):
    a = torch.randn(64, 64, device="mydev")
    s = torch.mydev.Stream()
    torch.mydev.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        b = a @ a
        with torch.mydev.stream(s):
            c = a + 1
        s.synchronize()
    kernels = {e["name"].split(".")[0]: e for e in _chrome_trace(prof, tmp_path) if e.get("cat") == "kernel"}
    assert kernels["aten::mm"]["args"]["stream"] == 0                 # the default stream
    assert kernels["aten::add"]["args"]["stream"] == s.stream_id
    # The stream is the kernel's row in the trace.
    assert kernels["aten::mm"]["tid"] != kernels["aten::add"]["tid"]
    for e in kernels.values():
        assert e["dur"] > 0 and e["args"]["device"] == 0
    assert torch.equal(b.cpu(), a.cpu() @ a.cpu()) and torch.equal(c.cpu(), a.cpu() + 1)


def test_chrome_trace_has_device_rows(tmp_path):
    model, opt, x = _model()
    with profile(activities=ACTIVITIES) as prof:
        _step(model, opt, x)
        torch.ones(4, device="mydev").cpu()
    events = _chrome_trace(prof, tmp_path)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    cpu_ops = [e for e in events if e.get("cat") == "cpu_op"]
    assert kernels and cpu_ops
    # Kernels are on the device's rows, not on a host thread's.
    assert {e["pid"] for e in kernels}.isdisjoint({e["pid"] for e in cpu_ops})
    # Each kernel carries the correlation id of the op that launched it.
    op_ids = {e["args"].get("External id") for e in cpu_ops}
    assert all(e["args"]["correlation"] in op_ids for e in kernels)
    # Copies are device rows too, with their direction and size.
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    assert any(e["name"] == "Memcpy DtoH (mydev)" and e["args"]["bytes"] == 16 for e in copies)


def test_memory_events():
    torch.mydev.synchronize()
    with profile(activities=ACTIVITIES, profile_memory=True) as prof:
        x = torch.empty(1000, device="mydev")
        y = x.fill_(1) * 2
        del x
    avg = {e.key: e for e in prof.key_averages()}
    # The 4000-byte allocation (a 4096-byte block) belongs to the op that made it, in device memory.
    assert avg["aten::empty"].device_memory_usage == 4096 and avg["aten::empty"].cpu_memory_usage == 0
    assert avg["aten::mul"].device_memory_usage == 4096
    # A free outside any op is a "[memory]" event of its own.
    frees = [e.device_memory_usage for e in prof.events() if e.name == "[memory]"]
    assert -4096 in frees
    assert "MYDEV Mem" in prof.key_averages().table(row_limit=3)
    assert y.sum().item() == 2000


def test_cpu_only_profile_has_no_device_events_and_device_keeps_working():
    a = torch.ones(10, device="mydev")
    with profile(activities=ACTIVITIES) as prof:
        c = a + 1
    assert _device_events(prof)
    # After a device profile (the device's profiler stays registered with Kineto), a CPU-only one
    # still records host events only.
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        b = a * 3
    assert not _device_events(prof)
    assert any(e.name == "aten::mul" for e in prof.events())
    assert torch.equal((b + c).cpu(), torch.full((10,), 5.0))


def test_legacy_autograd_profiler_device_time():
    # torch.autograd.profiler.profile(use_device=...) defaults to use_kineto=False: PyTorch times each
    # op with device events through the stubs the backend registers (registerPrivateUse1Methods).
    a = torch.randn(64, 64, device="mydev")
    torch.mydev.synchronize()
    with torch.autograd.profiler.profile(use_device="mydev") as prof:
        b = (a @ a).relu()
    ops = {e.name: e for e in prof.function_events}
    assert ops["aten::mm"].device_time_total > 0 and ops["aten::relu"].device_time_total > 0
    # The enclosing op's device time includes its callee's.
    assert ops["aten::matmul"].device_time_total >= ops["aten::mm"].device_time_total
    assert torch.allclose(b.cpu(), (a.cpu() @ a.cpu()).relu(), atol=1e-4)


# Allocations made inside kernels: a queued kernel's CPU code allocates its scratch memory (sort's
# buffers, convolution's unfolded input) in device memory on the stream's worker thread. The same ops
# run at the call under MYDEV_LAUNCH_BLOCKING=1, where those allocations are made on the profiling
# thread and reported as host-side allocation events: the reference. The stream has the test delay: a
# host thread that synchronises runs the kernels queued behind the one in progress itself, and they
# would report there; a delayed stream's work stays its worker's.
KERNEL_ALLOCATIONS = r"""
import json, torch, my_device
from torch.profiler import profile, ProfilerActivity
v = torch.randn(100000, generator=torch.Generator().manual_seed(0)).to("mydev")
w = torch.randn(1, 1, 64, 64, generator=torch.Generator().manual_seed(1)).to("mydev")
k = torch.ones(2, 1, 5, 5, device="mydev")
torch.sort(v), torch.nn.functional.conv2d(w, k)   # (a signature's first call runs at the call)
torch.mydev.synchronize()
stream = torch.mydev.current_stream()
my_device._C._test_set_stream_delay(stream.stream_id, stream.device_index, 1000)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=True) as prof:
    s, i = torch.sort(v)
    c = torch.nn.functional.conv2d(w, k)
    torch.mydev.synchronize()
ops = [e for e in prof.profiler.kineto_results.events() if e.name().startswith("aten::")]
host_threads = {e.start_thread_id() for e in ops}
events = [[e.nbytes(), e.start_thread_id() in host_threads, e.device_type() == torch.autograd.DeviceType.PrivateUse1]
          for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
correct = torch.equal(s.cpu(), torch.sort(v.cpu())[0]) and torch.allclose(
    c.cpu(), torch.nn.functional.conv2d(w.cpu(), k.cpu()), atol=1e-4)
print(json.dumps({"events": events, "correct": correct}))
"""


def test_allocations_inside_queued_kernels_are_memory_events(python_subprocess):
    runs = {}
    for blocking in ("0", "1"):
        result = python_subprocess(KERNEL_ALLOCATIONS, env={"MYDEV_LAUNCH_BLOCKING": blocking})
        assert result.returncode == 0, result.stderr
        runs[blocking] = json.loads(result.stdout.strip().splitlines()[-1])
        assert runs[blocking]["correct"]
        assert all(on_device for _, _, on_device in runs[blocking]["events"])
    queued, at_the_call = runs["0"]["events"], runs["1"]["events"]
    # The same allocations and frees, whichever thread made them.
    assert sorted(n for n, _, _ in queued) == sorted(n for n, _, _ in at_the_call)
    # At the call, every one is the profiling thread's; queued, the kernels' scratch memory is the
    # worker's (allocated and freed there: sort's 800256-byte buffer, the unfolded convolution input).
    assert all(host for _, host, _ in at_the_call)
    on_worker = [n for n, host, _ in queued if not host]
    assert 800256 in on_worker and -800256 in on_worker and sum(on_worker) == 0
    assert len(on_worker) >= 6


def _allocation_sizes(prof):
    return [e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]


def test_kernel_allocations_after_the_profile_are_not_reported():
    v = torch.randn(100000, device="mydev")
    with profile(activities=ACTIVITIES, profile_memory=True) as prof:
        torch.sort(v)
        torch.mydev.synchronize()
    assert 800256 in _allocation_sizes(prof)
    # The session is over: workers no longer report (the next profile starts clean).
    torch.sort(v)
    torch.mydev.synchronize()
    with profile(activities=ACTIVITIES, profile_memory=True) as prof:
        b = v + 1
        torch.mydev.synchronize()
    assert 800256 not in _allocation_sizes(prof) and -800256 not in _allocation_sizes(prof)
    # Without profile_memory, kernels report nothing either.
    with profile(activities=ACTIVITIES) as prof:
        torch.sort(v)
        torch.mydev.synchronize()
    assert _allocation_sizes(prof) == []
    assert torch.equal(b.cpu(), v.cpu() + 1)


def test_copies_are_the_work_of_copy_as_on_cuda():
    # On CUDA a copy's memcpy (or strided copy kernel) belongs to aten::copy_. PyTorch routes copies of a
    # PrivateUse1 device through aten::_copy_from, called by copy_: its work is shown as copy_'s.
    x = torch.randn(1000, device="mydev")
    y = torch.empty(1000, device="mydev")
    m = torch.randn(64, 64, device="mydev")
    h = torch.randn(1000)
    torch.mydev.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        y.copy_(x)                  # DtoD
        c = x.clone()               # DtoD, copy_ called by clone
        t = m.t().contiguous()      # a strided copy: a kernel
        d = x.to("mydev:1")         # between devices
        u = h.to("mydev")           # HtoD
        b = x.cpu()                 # DtoH
        # _copy_from called directly, not by copy_: it keeps its own work.
        direct = torch.empty(1000, device="mydev")
        torch.ops.aten._copy_from(x, direct)
        torch.mydev.synchronize()
    # (copy_ calls that reach _copy_from: the strided copy's kernel runs a CPU copy_ of its own)
    copies = [e for e in prof.events()
              if e.name == "aten::copy_" and any(c.name == "aten::_copy_from" for c in e.cpu_children)]
    copy_from = [e for e in prof.events() if e.name == "aten::_copy_from"]
    assert len(copies) == 6 and len(copy_from) == 7
    kernels = sorted(k.name for e in copies for k in e.kernels)
    assert kernels == sorted(["Memcpy DtoD (mydev)"] * 3 + ["aten::copy_", "Memcpy HtoD (mydev)",
                                                            "Memcpy DtoH (mydev)"])
    assert all(e.kernels == [] for e in copy_from if e.cpu_parent is not None and e.cpu_parent.name == "aten::copy_")
    assert [k.name for e in copy_from if e.cpu_parent is None for k in e.kernels] == ["Memcpy DtoD (mydev)"]
    for e in copies:
        assert all(k.duration > 0 for k in e.kernels)
    avg = {e.key: e for e in prof.key_averages()}
    assert avg["aten::copy_"].self_device_time_total > 0
    assert torch.equal(y.cpu(), x.cpu()) and torch.equal(t.cpu(), m.cpu().t()) and torch.equal(d.cpu(), b)
    assert torch.equal(u.cpu(), h) and torch.equal(direct.cpu(), b) and torch.equal(c.cpu(), b)
