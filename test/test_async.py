"""Asynchronous execution: queued kernels, synchronising host reads, events across streams,
errors reported at the next synchronisation, and memory kept alive until kernels ran.

Asynchrony is made observable with a test hook that delays a stream's worker
before each task; nothing here asserts on timings."""
import copy
import gc
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import my_device
from conftest import delayed


def test_launch_returns_before_the_kernel_ran_and_sync_waits():
    a = torch.arange(1000.0, device="mydev")
    s = torch.mydev.Stream()
    a + 1                              # (a process's first call of an op class and dtype runs at the call)
    torch.mydev.synchronize()
    with delayed(s), torch.mydev.stream(s):
        b = a + 1                      # queued on s
        assert not s.query()           # ...and not run yet
        s.synchronize()
        assert s.query()
    torch.testing.assert_close(b.cpu(), torch.arange(1000.0) + 1)


def _voluntary_switches():
    with open("/proc/thread-self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


_PROC_STATUS = pytest.mark.skipif(not os.path.exists("/proc/thread-self/status"),
                                  reason="counts context switches in Linux's /proc")


@_PROC_STATUS
@pytest.mark.parametrize("sync", ["stream", "device"])
def test_a_synchronising_host_sleeps_until_its_work_is_done_not_per_task(sync):
    # A host blocked in a synchronisation was once woken at every completed
    # task and went back to sleep: a futex wake per task on the worker's side,
    # which slowed a queue of 20 us matrix products by 1.2-1.9x.
    s = torch.mydev.default_stream()
    x_cpu = torch.randn(64)
    x = x_cpu.to("mydev")
    torch.mydev.synchronize()
    tasks = 40
    with delayed(s, 2000):             # 2 ms of "device time" per task: the host must block
        for _ in range(tasks):
            x, x_cpu = x.mul(1.01), x_cpu.mul(1.01)
        before = _voluntary_switches()
        s.synchronize() if sync == "stream" else torch.mydev.synchronize()
        woken = _voluntary_switches() - before
        assert s.query()
    torch.testing.assert_close(x.cpu(), x_cpu)
    # One sleep for the whole queue; a few more for the page faults or signals
    # of a busy machine, but nowhere near one per task.
    assert woken <= 5, f"the host was woken {woken} times while {tasks} tasks completed"


@_PROC_STATUS
def test_a_host_kernel_waiting_for_queued_work_sleeps_until_its_turn():
    # The same for a host kernel that runs at the call in stream order
    # (nonzero: its output's shape depends on the data) behind queued work.
    # Real matrix products, not the test delay: a delayed worker hands over
    # the stream differently.
    torch.manual_seed(0)
    b, a, w = torch.randn(64), torch.randn(16, 512), torch.randn(512, 64)
    bd, ad, wd = b.to("mydev"), a.to("mydev"), w.to("mydev")
    tasks = 100
    threads = torch.get_num_threads()
    # One intra-op thread, so that the worker's products leave the host a core
    # to queue them faster than they run.
    torch.set_num_threads(1)
    try:
        for _ in range(2):  # the first round warms up the host's path, during which the worker drains the queue
            torch.mydev.synchronize()
            outs = [torch.addmm(bd, ad, wd) for _ in range(tasks)]
            before = _voluntary_switches()
            nonzero = torch.nonzero(outs[-1] > 0)
            woken = _voluntary_switches() - before
    finally:
        torch.set_num_threads(threads)
    expected = torch.addmm(b, a, w)
    torch.testing.assert_close(nonzero.cpu(), torch.nonzero(expected > 0))
    torch.testing.assert_close(outs[0].cpu(), expected)
    assert woken <= 10, f"the host was woken {woken} times while waiting for {tasks} queued products"


class _Seen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("sync", ["device", "stream"])
def test_queued_kernels_a_synchronising_host_runs_do_not_see_its_dispatch_mode(sync):
    # A host thread that waits for a stream runs the queued kernels behind the
    # one in progress itself (the runtime's drainUntil). Whatever it is inside
    # then must not reach them: a CPU addmm dispatches expand, copy_ and
    # resolve_conj internally, which a TorchDispatchMode on the host would see
    # (and, being Python, run under the GIL the kernel does not hold). Only a
    # synchronisation shows it: a wait inside an op (.item(), nonzero) runs
    # while the mode handles that op, which disables the mode.
    torch.manual_seed(0)
    big = torch.randn(512, 512)
    bias, a, w = torch.randn(64), torch.randn(16, 512), torch.randn(512, 64)
    bigd, biasd, ad, wd = (t.to("mydev") for t in (big, bias, a, w))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the long product keeps the worker busy while the host queues the rest
    try:
        torch.mydev.synchronize()
        long = bigd @ bigd
        outs = [torch.addmm(biasd, ad, wd) for _ in range(20)]
        seen = _Seen()
        with seen:
            torch.mydev.synchronize() if sync == "device" else torch.mydev.current_stream().synchronize()
    finally:
        torch.set_num_threads(threads)
    assert seen.ops == []
    torch.testing.assert_close(long.cpu(), big @ big)
    for out in outs:
        torch.testing.assert_close(out.cpu(), torch.addmm(bias, a, w))


def test_kernels_on_a_non_current_device_queue_on_that_devices_stream():
    # Queued kernels (add_) and host kernels (relu) on mydev:1, launched while
    # mydev:0 is current, must share mydev:1's stream and so run in order.
    assert torch.mydev.current_device() == 0
    x_cpu = torch.randn(64)
    x = x_cpu.to("mydev:1")
    with delayed(torch.mydev.default_stream(1)):
        for _ in range(5):
            x, x_cpu = torch.relu(x).add_(0.1), torch.relu(x_cpu).add_(0.1)
            x, x_cpu = x - x.mean(), x_cpu - x_cpu.mean()
    torch.testing.assert_close(x.cpu(), x_cpu)


def test_host_reads_synchronise():
    a = torch.arange(10.0, device="mydev")
    s = torch.mydev.default_stream()
    with delayed(s):
        b = a * 3
        assert not s.query()
        assert b.sum().item() == 135.0         # .item() waits for the queued kernel
        c = a + 2
        assert torch.equal(c.cpu(), torch.arange(10.0) + 2)   # so does .cpu()
        d = a - 1
        assert "8." in repr(d)                 # and printing


def test_events_order_work_across_streams():
    a = torch.ones(4096, device="mydev")
    torch.mydev.synchronize()
    s1, s2 = torch.mydev.Stream(), torch.mydev.Stream()
    with delayed(s1):
        with torch.mydev.stream(s1):
            x = a * 5                          # slow stream produces x
            done = s1.record_event()
        s2.wait_event(done)
        with torch.mydev.stream(s2):
            y = x + 1                          # fast stream consumes it, only after the event
        assert not s2.query()                  # s2 is held back by s1's event
        s2.synchronize()
    torch.testing.assert_close(y.cpu(), torch.full((4096,), 6.0))


def test_kernel_error_surfaces_at_next_sync_naming_the_op():
    a = torch.arange(5.0, device="mydev")
    my_device._C._test_inject_kernel_failure("aten::mul.Tensor")
    b = a * 3                                  # the launch itself succeeds
    with pytest.raises(RuntimeError, match=r"aten::mul\.Tensor: injected failure"):
        torch.mydev.synchronize()
    torch.mydev.synchronize()                  # reported once
    torch.testing.assert_close(a.cpu(), torch.arange(5.0))
    torch.testing.assert_close((a * 3).cpu(), torch.arange(5.0) * 3)
    del b


@pytest.mark.parametrize("read", ["cpu", "item", "print"])
def test_a_host_read_after_a_failed_kernel_raises_naming_the_op(read):
    # A host read waits for the device, so it is a synchronisation: it must not
    # hand back the bytes of a kernel that failed (cudaMemcpy reports it too).
    a = torch.arange(5.0, device="mydev")
    my_device._C._test_inject_kernel_failure("aten::mul.Tensor")
    b = (a * 3).sum()
    with pytest.raises(RuntimeError, match=r"aten::mul\.Tensor: injected failure"):
        {"cpu": lambda: b.cpu(), "item": lambda: b.item(), "print": lambda: str(b)}[read]()
    torch.mydev.synchronize()                  # reported once
    assert (a * 3).sum().item() == 30.0        # the device still works


@pytest.mark.parametrize("setup,launch,error", [
    ('a + 1; my_device._C._test_inject_kernel_failure("aten::add.Tensor")', "a + 1",
     "aten::add.Tensor: injected failure"),
    ('a[torch.tensor([1], device="mydev")]', 'a[torch.tensor([7], device="mydev")]',
     "aten::index.Tensor: index 7 is out of bounds"),
])
def test_launch_blocking_raises_at_the_launch(python_subprocess, setup, launch, error):
    r = python_subprocess(f"""
        import torch, my_device
        a = torch.arange(5.0, device="mydev")
        {setup}
        try:
            {launch}
        except (RuntimeError, IndexError) as e:   # (the CPU's type: IndexError for an index)
            assert {error!r} in str(e), e
        else:
            raise SystemExit("no error at the launch")
        torch.mydev.synchronize()              # nothing left to report
        assert (a + 1).sum().item() == 15
        print("ok")
    """, env={"MYDEV_LAUNCH_BLOCKING": "1"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def _dof_warnings(record):
    return [(w.category, str(w.message)) for w in record if "degrees of freedom" in str(w.message)]


@pytest.mark.parametrize("sync", ["synchronize", "stream", "event", "cpu", "item", "next launch"])
def test_a_kernels_warning_is_raised_at_the_call_even_with_the_stream_busy(sync, capfd):
    # var's CPU kernel warns when the correction leaves no degrees of freedom, a
    # check of the arguments that CUDA makes on the host. A call whose signature
    # warned keeps running at the call, so the warning comes there every time,
    # inside the caller's catch_warnings, and no synchronisation repeats it.
    x = torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as on_cpu:
        warnings.simplefilter("always")
        expected = x.var(dim=0, correction=5)
    assert len(_dof_warnings(on_cpu)) == 1
    s = torch.mydev.Stream()
    d = x.to("mydev")
    torch.mydev.synchronize()
    for _ in range(2):
        with warnings.catch_warnings(record=True) as on_mydev:
            warnings.simplefilter("always")
            with delayed(s, 50_000) as held, torch.mydev.stream(held):
                d.add(1)                               # work ahead of it on the stream
                got = d.var(dim=0, correction=5)
                assert _dof_warnings(on_mydev) == _dof_warnings(on_cpu)
                if sync == "synchronize":
                    torch.mydev.synchronize()
                elif sync == "stream":
                    held.synchronize()
                elif sync == "event":
                    held.record_event().synchronize()
                elif sync == "cpu":
                    got.cpu()
                elif sync == "item":
                    got[0].item()
                else:
                    d.add(1)
            torch.mydev.synchronize()
        assert len(_dof_warnings(on_mydev)) == 1           # raised once, at the call
    assert "degrees of freedom" not in capfd.readouterr().err
    torch.testing.assert_close(got.cpu(), expected)


def test_launch_blocking_raises_a_kernels_warning_at_the_launch(python_subprocess):
    r = python_subprocess("""
        import warnings, torch, my_device
        d = torch.randn(3, 4, device="mydev")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            d.var(dim=0, correction=5)
            print(sum("degrees of freedom" in str(x.message) for x in w))
    """, env={"MYDEV_LAUNCH_BLOCKING": "1"})
    assert r.returncode == 0 and r.stdout.split() == ["1"], r.stdout + r.stderr
    assert "degrees of freedom" not in r.stderr


def test_inputs_and_outputs_live_until_the_kernel_ran():
    s = torch.mydev.Stream()
    with delayed(s), torch.mydev.stream(s):
        a = torch.full((1 << 16,), 2.0, device="mydev")
        b = a * 4
        del a                                  # the queued kernel still holds a
        c = b + 1
        del b
        s.synchronize()
    torch.testing.assert_close(c.cpu(), torch.full((1 << 16,), 9.0))


def test_record_stream_delays_reuse_until_the_other_stream_finished():
    n = 3 << 20
    s = torch.mydev.Stream()
    x = torch.empty(n, dtype=torch.uint8, device="mydev")
    torch.mydev.synchronize()
    ptr = x.data_ptr()
    with delayed(s):
        with torch.mydev.stream(s):
            torch.ones(1, device="mydev").add_(1)   # pending work on s
        x.record_stream(s)
        del x
        y = torch.empty(n, dtype=torch.uint8, device="mydev")
        assert y.data_ptr() != ptr                 # s may still use x's block
        s.synchronize()
    del y
    z = torch.empty(n, dtype=torch.uint8, device="mydev")
    w = torch.empty(n, dtype=torch.uint8, device="mydev")
    assert ptr in (z.data_ptr(), w.data_ptr())     # once s finished, the block is reused


MIB4 = 1 << 20  # float32 elements in 4 MiB: large enough to be leased (KernelArgs.h)


def test_freed_blocks_go_back_to_their_stream_while_kernels_are_queued():
    # A host running ahead of the device must not keep the memory of every
    # tensor it dropped: as with CUDA, a freed block returns to its stream at
    # once, and the next allocation there reuses it behind the queued kernels.
    x = torch.randn(MIB4)
    d = x.to("mydev")
    s = torch.mydev.current_stream()
    torch.mydev.synchronize()
    base = torch.mydev.memory_allocated()
    torch.mydev.reset_peak_memory_stats()
    reserved = torch.mydev.memory_reserved()
    with delayed(s, us=2000):
        for _ in range(50):
            y = d.clamp(-0.5, 0.5)
            z = y * 2
        assert not s.query()                                  # the kernels are still queued
        assert torch.mydev.memory_allocated() == base + 2 * 4 * MIB4   # only y and z are allocated
        assert torch.mydev.max_memory_reserved() <= reserved + 4 * 4 * MIB4
    torch.testing.assert_close(z.cpu(), x.clamp(-0.5, 0.5) * 2)


def test_reused_blocks_hold_what_each_kernel_wrote_in_stream_order():
    x = torch.randn(MIB4)
    d = x.to("mydev")
    s = torch.mydev.current_stream()
    with delayed(s, us=1000):
        sums, ptrs = [], set()
        for i in range(20):
            t = d * float(i)          # dropped next iteration: its block is reused by the next t
            ptrs.add(t.data_ptr())
            sums.append((t + 1).sum())
        assert not s.query()
    assert len(ptrs) <= 2                                    # the blocks were reused while queued
    for i, got in enumerate(sums):
        torch.testing.assert_close(got.cpu(), (x * float(i) + 1).sum())


def test_blocks_used_by_another_streams_kernels_are_not_reused_before_they_ran():
    # CUDA would let the allocation stream reuse x's block at once (unless
    # record_stream was called); mydev holds it until s2's kernel ran.
    s2 = torch.mydev.Stream()
    x = torch.full((MIB4,), 3.0, device="mydev")
    torch.mydev.synchronize()
    ptr = x.data_ptr()
    with delayed(s2):
        with torch.mydev.stream(s2):
            y = x * 2                                       # queued on s2, reads x
        del x
        z = torch.full((MIB4,), 7.0, device="mydev")        # runs now, on the default stream
        assert z.data_ptr() != ptr
        assert not s2.query()
    torch.testing.assert_close(y.cpu(), torch.full((MIB4,), 6.0))
    torch.testing.assert_close(z.cpu(), torch.full((MIB4,), 7.0))


def test_empty_cache_waits_for_kernels_using_freed_blocks():
    s = torch.mydev.current_stream()
    with delayed(s):
        x = torch.full((MIB4,), 2.0, device="mydev")
        y = x * 3                                           # queued; leases x's block
        del x
        assert not s.query()
        torch.mydev.empty_cache()                           # may not unmap x's block under the kernel
        assert s.query()
    torch.testing.assert_close(y.cpu(), torch.full((MIB4,), 6.0))


def test_a_queued_kernel_keeps_a_storage_the_caller_swapped_out():
    # A TensorIterator kernel shares the caller's TensorImpl; set_ then drops
    # the old storage while the kernel, queued on another stream, still reads it.
    s2 = torch.mydev.Stream()
    x = torch.full((MIB4,), 3.0, device="mydev")
    torch.mydev.synchronize()
    with delayed(s2):
        with torch.mydev.stream(s2):
            y = x * 2
        x.set_(torch.empty(0, device="mydev"))
        z = torch.full((MIB4,), 7.0, device="mydev")        # would take the old block at once
        assert not s2.query()
    torch.testing.assert_close(y.cpu(), torch.full((MIB4,), 6.0))
    torch.testing.assert_close(z.cpu(), torch.full((MIB4,), 7.0))


def test_a_kernel_out_of_memory_reclaims_its_streams_cache(python_subprocess):
    # Inside a kernel its own stream counts as busy, yet the blocks that were
    # free before the kernel took its place there can go back to the device.
    r = python_subprocess("""
        import torch, my_device
        MiB = 1 << 20
        cached = [torch.empty(2 * MiB, device="mydev") for _ in range(3)]   # 3 x 8 MiB
        del cached                                                          # 24 of 32 MiB reserved, all free
        x = torch.arange(MiB, dtype=torch.float32, device="mydev")          # 4 MiB, split from one of them
        y = torch.cat([x, x, x, x])        # a host kernel run at the call; its 16 MiB output needs the cache
        assert torch.equal(y.cpu(), torch.arange(MiB, dtype=torch.float32).repeat(4))
        stats = torch.mydev.memory_stats()
        assert stats["num_ooms"] == 0 and stats["num_alloc_retries"] == 1, stats   # it did need the cache
        print("ok")
    """, env={"MYDEV_MEMORY_LIMIT": "32M"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_out_of_memory_waits_for_queued_kernels_before_giving_up(python_subprocess):
    r = python_subprocess("""
        import torch, my_device
        MiB = 1 << 20
        s = torch.mydev.current_stream()
        x = torch.full((2 * MiB,), 2.0, device="mydev")          # 8 MiB of 32
        torch.mydev.synchronize()
        my_device._C._test_set_stream_delay(s.stream_id, s.device_index, 200_000)
        y = x * 3                                                 # 8 MiB, queued; leases x
        del x                                                     # cached, but its stream is busy
        big = torch.empty(6 * MiB, device="mydev")                # 24 MiB: fits once x's segment is freed
        my_device._C._test_set_stream_delay(s.stream_id, s.device_index, 0)
        assert torch.equal(y.cpu(), torch.full((2 * MiB,), 6.0))
        stats = torch.mydev.memory_stats()
        assert stats["num_ooms"] == 0 and stats["num_alloc_retries"] == 1, stats
        print("ok")
    """, env={"MYDEV_MEMORY_LIMIT": "32M"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_non_blocking_copy_from_pinned_is_queued():
    host = torch.arange(1 << 16, dtype=torch.float32).pin_memory()
    dev = torch.empty(1 << 16, device="mydev")
    s = torch.mydev.current_stream()
    with delayed(s):
        dev.copy_(host, non_blocking=True)
        assert not s.query()
        s.synchronize()
    torch.testing.assert_close(dev.cpu(), torch.arange(1 << 16, dtype=torch.float32))


def test_queued_kernels_do_not_keep_the_callers_python_objects_alive():
    # If a pending kernel held the TensorImpl that a Python tensor wraps,
    # dropping that tensor would keep its Python object alive until the kernel
    # was reaped, and a loop of small ops would keep triggering the garbage
    # collector (the CPU runs this loop with no collection at all).
    a = torch.ones(16, device="mydev")
    gc.collect()
    before = gc.get_stats()[0]["collections"]
    with delayed(torch.mydev.default_stream(), us=20):
        for _ in range(3000):
            c = a + a
    assert gc.get_stats()[0]["collections"] == before
    torch.testing.assert_close(c.cpu(), torch.full((16,), 2.0))


def test_small_host_kernels_optimizer_foreach_ops_and_pooling_are_queued():
    # (each in-place foreach op is one queued kernel for the whole list)
    x = torch.randn(4, 3, 8, 8)
    params = [torch.randn(16) for _ in range(3)]
    d, dparams = x.to("mydev"), [p.to("mydev") for p in params]
    s = torch.mydev.default_stream()
    torch.mydev.synchronize()
    with delayed(s):
        c = torch.cumsum(d, dim=1)                           # 768 elements, a host kernel
        pooled, indices = torch.nn.functional.max_pool2d(d, 2, return_indices=True)
        torch._foreach_mul_(dparams, 0.5)                    # an optimizer's in-place foreach op
        torch._foreach_add_(dparams, dparams, alpha=2.0)
        assert not s.query()                                 # all queued, none run yet
    torch.testing.assert_close(c.cpu(), torch.cumsum(x, dim=1))
    want, want_indices = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
    torch.testing.assert_close(pooled.cpu(), want)
    assert torch.equal(indices.cpu(), want_indices)
    torch._foreach_mul_(params, 0.5)
    torch._foreach_add_(params, params, alpha=2.0)
    for got, want in zip(dparams, params):
        torch.testing.assert_close(got.cpu(), want)


def test_convolution_and_its_backward_are_queued_with_errors_at_the_call():
    conv = torch.nn.Conv2d(3, 5, 3, padding=1)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    dconv = torch.nn.Conv2d(3, 5, 3, padding=1).to("mydev")
    dconv.load_state_dict(conv.state_dict())
    dx = x.detach().to("mydev").requires_grad_()
    s = torch.mydev.default_stream()
    dconv(dx)  # a signature's first call runs at the call, where the CPU kernel checks it
    torch.mydev.synchronize()
    with delayed(s):
        out = dconv(dx)
        assert out.shape == (2, 5, 8, 8) and not s.query()       # shape known at once, kernel queued
        with pytest.raises(RuntimeError, match="expected input"):  # argument errors still come at the call
            dconv(torch.randn(2, 4, 8, 8, device="mydev"))
        with pytest.raises(RuntimeError, match="should be the same"):  # so do dtype mixes
            torch.nn.functional.conv2d(dx.detach(), dconv.weight.detach().double())
        with pytest.raises(RuntimeError, match="same device"):
            torch.nn.functional.conv2d(dx.detach(), conv.weight.detach())
        cl = dconv(dx.detach().contiguous(memory_format=torch.channels_last))
        assert cl.is_contiguous(memory_format=torch.channels_last)   # the CPU's layout
    out.sum().backward()
    conv(x).sum().backward()
    torch.testing.assert_close(out.cpu(), conv(x).detach())
    torch.testing.assert_close(dx.grad.cpu(), x.grad)
    torch.testing.assert_close(dconv.weight.grad.cpu(), conv.weight.grad)
    torch.testing.assert_close(dconv.bias.grad.cpu(), conv.bias.grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_convolution_is_queued_and_matches_cpu(dtype):
    # autocast runs convolutions in these dtypes; they must not make the host wait.
    x = torch.randn(2, 3, 8, 8, dtype=dtype, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=dtype, requires_grad=True)
    y = torch.nn.functional.conv2d(x, w, padding=1)
    grad = torch.randn_like(y)
    y.backward(grad)
    dx, dw = (t.detach().to("mydev").requires_grad_() for t in (x, w))
    dgrad = grad.to("mydev")
    torch.mydev.synchronize()
    torch.mydev.set_sync_debug_mode("error")
    try:
        dy = torch.nn.functional.conv2d(dx, dw, padding=1)
        dy.backward(dgrad)
    finally:
        torch.mydev.set_sync_debug_mode(0)
    torch.testing.assert_close(dy.cpu(), y.detach())
    torch.testing.assert_close(dx.grad.cpu(), x.grad)
    torch.testing.assert_close(dw.grad.cpu(), w.grad)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_is_queued_and_matches_cpu_on_any_layout(training):
    x = torch.randn(4, 3, 6, 6)
    bn = torch.nn.BatchNorm2d(3).train(training)
    dbn = torch.nn.BatchNorm2d(3).to("mydev").train(training)
    s = torch.mydev.default_stream()
    for inp, d in ((x, x.to("mydev")),
                   (x.contiguous(memory_format=torch.channels_last),
                    x.to("mydev").contiguous(memory_format=torch.channels_last)),
                   (x[..., ::2], x.to("mydev")[..., ::2])):
        copy.deepcopy(dbn)(d)                  # (the signature's first call runs at the call)
        torch.mydev.synchronize()
        with delayed(s):
            got = dbn(d)
            assert not s.query()
        torch.testing.assert_close(got.cpu(), bn(inp))
        torch.testing.assert_close(dbn.running_mean.cpu(), bn.running_mean)
        torch.testing.assert_close(dbn.running_var.cpu(), bn.running_var)
    # The statistics outputs as the CPU gives them: empty in eval mode, float
    # for a half input with float parameters.
    for dtype in (torch.float32, torch.float16):
        args = [torch.randn(2), torch.randn(2), torch.zeros(2), torch.ones(2)]
        xin = torch.randn(3, 2, 4, 4).to(dtype)
        want = torch.native_batch_norm(xin, *args, training, 0.1, 1e-5)
        got = torch.native_batch_norm(xin.to("mydev"), *[a.to("mydev") for a in args], training, 0.1, 1e-5)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            torch.testing.assert_close(g.cpu(), w)
    with pytest.raises(RuntimeError, match="mixed dtype"):     # the CPU kernel's error, at the call
        torch.native_batch_norm(x.double().to("mydev"), *[a.to("mydev") for a in args], training, 0.1, 1e-5)


def test_batch_norm_backward_is_queued():
    x = torch.randn(4, 3, 6, 6, requires_grad=True)
    bn = torch.nn.BatchNorm2d(3)
    dbn = torch.nn.BatchNorm2d(3).to("mydev")
    dx = x.detach().to("mydev").requires_grad_()
    dbn(dx).pow(2).sum().backward()            # (the signatures' first calls run at the call)
    dx.grad = None
    dbn.zero_grad()
    out = dbn(dx)
    s = torch.mydev.default_stream()
    torch.mydev.synchronize()
    with delayed(s):
        out.pow(2).sum().backward()
        assert not s.query()
    bn(x).pow(2).sum().backward()
    torch.testing.assert_close(dx.grad.cpu(), x.grad)
    torch.testing.assert_close(dbn.weight.grad.cpu(), bn.weight.grad)
    torch.testing.assert_close(dbn.bias.grad.cpu(), bn.bias.grad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reduced_precision_host_kernels_are_queued_once_their_cpu_kernel_ran(dtype):
    # Not every CPU kernel has half/bfloat16 loops, and a missing one must fail
    # at the call: the first call of a dtype signature runs there, later ones queue.
    x = torch.randn(64, 64).to(dtype)
    d = x.to("mydev")
    s = torch.mydev.default_stream()
    queued = []
    for _ in range(3):
        torch.mydev.synchronize()
        with delayed(s, us=20_000):
            y = torch.cumsum(d, 1, dtype=dtype)
            queued.append(not s.query())
        assert torch.equal(y.cpu(), torch.cumsum(x, 1, dtype=dtype))
    assert queued[1:] == [True, True]


def test_a_cpu_scalar_argument_is_read_at_the_launch():
    # As CUDA reads CPU scalars when it launches a kernel.
    a, b = torch.zeros(8, device="mydev"), torch.ones(8, device="mydev")
    w = torch.tensor(0.5)
    s = torch.mydev.default_stream()
    torch.mydev.synchronize()
    with delayed(s):
        y = torch.lerp(a, b, w)
        z = a + w
        w.fill_(0.9)
        assert not s.query()
    torch.testing.assert_close(y.cpu(), torch.full((8,), 0.5))
    torch.testing.assert_close(z.cpu(), torch.full((8,), 0.5))


def test_cpu_batch_norm_out_still_mishandles_strided_input():
    # Why native_batch_norm's CPU out= kernel is not used (QueuedHostKernel.cpp,
    # avoid_out_kernel): it gets a strided input wrong. When this fails,
    # PyTorch has fixed it, and the out= kernel could save a copy.
    x = torch.randn(3, 2, 4, 10)[..., ::2]
    args = [torch.randn(2), torch.randn(2), torch.zeros(2), torch.ones(2)]
    want = torch.native_batch_norm(x, *[a.clone() for a in args], True, 0.1, 1e-5)[0]
    out, mean, invstd = torch.empty(3, 2, 4, 5), torch.empty(2), torch.empty(2)
    torch.ops.aten.native_batch_norm.out(x, *[a.clone() for a in args], True, 0.1, 1e-5,
                                         out=out, save_mean=mean, save_invstd=invstd)
    assert not torch.allclose(out, want, atol=1e-5)


@pytest.mark.parametrize("op", ["mse_loss", "smooth_l1_loss", "huber_loss"])
def test_cpu_loss_out_kernels_still_resize_a_reduced_output(op):
    # Why these losses' CPU out= kernels are not used (avoid_out_kernel): given
    # the 0-d output of a reduction, they first resize it to the inputs' shape
    # (with PyTorch's resize warning) and reduce into it afterwards. When this
    # fails, PyTorch has fixed it, and the out= kernels could save a copy.
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    out = torch.empty(())
    getattr(torch.ops.aten, op).out(x, y, 1, out=out)
    assert out.untyped_storage().nbytes() == 8 * 8 * 4
    torch.testing.assert_close(out, getattr(torch.nn.functional, op)(x, y))


def test_host_kernels_on_large_tensors_are_queued():
    # Host kernels with a Meta kernel and an out= overload are queued like the
    # structured ones (at any size, unless MYDEV_QUEUE_MIN_ELEMENTS says otherwise).
    x, w = torch.randn(1 << 19), torch.randn(512, 512)
    d, dw = x.to("mydev"), w.to("mydev")
    s = torch.mydev.default_stream()
    torch.relu(d[:2]), d[:2].clone().sigmoid_()  # (a process's first call of an op in a dtype runs at the call)
    torch.mydev.synchronize()
    with delayed(s):
        y = torch.relu(d)
        m = dw @ dw
        d.sigmoid_()
        assert not s.query()                   # all three queued, none run yet
        assert y.shape == x.shape and m.shape == (512, 512)   # shapes known at once
    torch.testing.assert_close(y.cpu(), torch.relu(x))
    torch.testing.assert_close(m.cpu(), w @ w)
    torch.testing.assert_close(d.cpu(), torch.sigmoid(x))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_queued_losses_match_cpu(reduction):
    # (The functional CPU kernel runs and its result is copied: see
    # test_cpu_loss_out_kernels_still_resize_a_reduced_output.)
    x, y = torch.randn(1 << 19), torch.randn(1 << 19)
    s = torch.mydev.default_stream()
    torch.nn.functional.mse_loss(x.to("mydev"), y.to("mydev"), reduction=reduction)   # (first call: at the call)
    torch.mydev.synchronize()
    with delayed(s):
        loss = torch.nn.functional.mse_loss(x.to("mydev"), y.to("mydev"), reduction=reduction)
        assert not s.query()
    torch.testing.assert_close(loss.cpu(), torch.nn.functional.mse_loss(x, y, reduction=reduction))


def test_queued_kernels_read_their_inputs_as_they_were_at_the_launch():
    # A GPU kernel captures its operands' pointers and strides when launched;
    # restriding an input afterwards must not change what it computes.
    a, b, x = torch.randn(64, 64), torch.randn(64, 64), torch.randn(1024, 512)
    y = torch.randn(1024, 512).sign()
    da, db, dx, dy = a.to("mydev"), b.to("mydev"), x.to("mydev"), y.to("mydev")
    s = torch.mydev.default_stream()
    torch.mydev.synchronize()
    with delayed(s):
        m = torch.mm(da, db)                   # structured kernel outside TensorIterator
        c = torch.clamp(dx, -0.5, 0.5)         # queued host kernel
        # composite out= kernel: resizes its output between two queued kernels
        loss = torch.nn.functional.soft_margin_loss(dx, dy)
        da.t_()
        dx.t_()
        assert not s.query()
    torch.testing.assert_close(m.cpu(), a @ b)
    torch.testing.assert_close(c.cpu(), x.clamp(-0.5, 0.5))
    torch.testing.assert_close(loss.cpu(), torch.nn.functional.soft_margin_loss(x, y))


def test_meta_cache_answers_by_dtype_geometry_and_values():
    # Queued host kernels ask the Meta kernel for their output shapes once per
    # call signature (QueuedHostKernel.cpp, MetaCache): dtype, strides, integer
    # scalar values and wrapped numbers are all part of that signature; floating
    # values are not (they change no geometry), so the bounds below share entries.
    base = torch.randn(1 << 10, 1 << 9)
    cases = [base, base.double(), base.t(), base[:, ::2], base[1:]]
    for _ in range(2):  # the second round is answered from the cache
        for x in cases:
            d = x.to("mydev")  # (.to keeps the strides of a non-overlapping, dense view)
            for lo, hi in ((-0.5, 0.5), (0, 1)):
                got = torch.clamp(d, lo, hi)
                want = torch.clamp(x, lo, hi)
                assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
                torch.testing.assert_close(got.cpu(), want)
            torch.testing.assert_close(torch.nn.functional.hardtanh(d, -0.25, 0.75).cpu(),
                                       torch.nn.functional.hardtanh(x, -0.25, 0.75))
        # argument errors come from the Meta kernel at every call, cached or not
        with pytest.raises(RuntimeError, match="must match the size"):
            torch.maximum(torch.randn(1 << 19, device="mydev"), torch.randn(1 << 18, device="mydev"))


def test_python_meta_kernels_still_override_the_cpp_ones():
    # The Meta cache exists because torch/_meta_registrations.py replaces the
    # C++ Meta kernels of most ops with Python ones (about 0.5 ms a call for
    # clamp). If this stops being true, the cache may no longer be worth it.
    table = torch._C._dispatch_dump("aten::clamp")
    meta = [line for line in table.splitlines() if line.startswith("Meta:")]
    assert meta and "_meta_registrations.py" in meta[0], table


def test_queued_host_kernels_keep_errors_at_the_call(kernel_threads):
    # Shape errors come from the Meta kernel, at the call; dtypes the CPU kernel
    # lacks keep such ops on the inline path, which raises the CPU's error.
    a, b = torch.randn(1 << 19, device="mydev"), torch.randn(1 << 18, device="mydev")
    with pytest.raises(RuntimeError, match="must match the size"):
        torch.maximum(a, b)
    big = torch.ones(1 << 19, dtype=torch.bool, device="mydev")
    with pytest.raises(RuntimeError, match="not implemented for 'Bool'"):
        big.view(512, 1024) @ big.view(1024, 512)
    torch.mydev.synchronize()                  # nothing was left to report
    assert torch.relu(a).sum().item() == torch.relu(a.cpu()).sum().item()


EVERY_HOST_KERNEL_AT_THE_CALL = str(1 << 62)


@pytest.mark.slow
def test_training_matches_cpu_with_every_host_kernel_run_at_the_call():
    # Eligible host kernels are queued at any size by default; a large
    # MYDEV_QUEUE_MIN_ELEMENTS runs them all at the call instead, so the
    # training tests exercise that path too. In strict mode, so a kernel
    # touching a device address would abort.
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, MYDEV_QUEUE_MIN_ELEMENTS=EVERY_HOST_KERNEL_AT_THE_CALL, MYDEV_STRICT="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.join(here, "test_training.py")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout, r.stdout[-500:]


@pytest.mark.slow
def test_conformance_subset_holds_with_every_host_kernel_run_at_the_call():
    # By default the OpInfo checks go through the queued path (Meta kernel at
    # the call, out= kernel on the worker); this runs the forward and backward
    # ones again with every host kernel run at the call, in strict mode.
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, MYDEV_QUEUE_MIN_ELEMENTS=EVERY_HOST_KERNEL_AT_THE_CALL, MYDEV_STRICT="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                        "test_forward or test_backward", os.path.join(here, "test_conformance.py")],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert " passed" in r.stdout, r.stdout[-500:]


def test_small_activations_and_their_backward_are_queued():
    # Pointwise math and activations run as queued structured kernels at any size.
    x = torch.randn(64, requires_grad=True)
    d = x.detach().to("mydev").requires_grad_()
    s = torch.mydev.default_stream()
    torch.mydev.synchronize()
    with delayed(s):
        y = torch.nn.functional.gelu(torch.sigmoid(d).relu() * 3).tanh().exp()
        assert not s.query()
        y.sum().backward()
    y_cpu = torch.nn.functional.gelu(torch.sigmoid(x).relu() * 3).tanh().exp()
    y_cpu.sum().backward()
    torch.testing.assert_close(y.detach().cpu(), y_cpu.detach())
    torch.testing.assert_close(d.grad.cpu(), x.grad)


def test_matrix_products_are_queued_and_match_cpu():
    # addmm's CPU kernel copies its bias into the output with copy_: inside a
    # queued kernel that copy must not be launched behind the kernel itself.
    torch.manual_seed(0)
    bias, x, w = torch.randn(4), torch.randn(3, 5), torch.randn(4, 5)
    b3 = torch.randn(2, 3, 5)
    s = torch.mydev.default_stream()
    # (Each op's first call of a dtype signature runs at the call; later ones queue.)
    torch.addmm(bias.to("mydev"), x.to("mydev"), w.to("mydev").t())
    torch.bmm(b3.to("mydev"), b3.to("mydev").transpose(1, 2))
    x.to("mydev") @ w.to("mydev").t()
    torch.mydev.synchronize()
    with delayed(s):
        out = torch.addmm(bias.to("mydev"), x.to("mydev"), w.to("mydev").t(), beta=0.5, alpha=2)
        row = torch.addmm(bias.unsqueeze(0).to("mydev"), x[:1].to("mydev"), w.to("mydev").t())
        prod = x.to("mydev") @ w.to("mydev").t()
        batched = torch.bmm(b3.to("mydev"), b3.to("mydev").transpose(1, 2))
        assert not s.query()
    torch.testing.assert_close(out.cpu(), torch.addmm(bias, x, w.t(), beta=0.5, alpha=2))
    torch.testing.assert_close(row.cpu(), torch.addmm(bias.unsqueeze(0), x[:1], w.t()))
    torch.testing.assert_close(prod.cpu(), x @ w.t())
    torch.testing.assert_close(batched.cpu(), torch.bmm(b3, b3.transpose(1, 2)))


def test_softmax_family_is_queued():
    x = torch.randn(8, 10, requires_grad=True)
    d = x.detach().to("mydev").requires_grad_()
    s = torch.mydev.default_stream()
    torch.mydev.synchronize()
    with delayed(s):
        y = torch.softmax(d, 1) * torch.log_softmax(d, 0)
        assert not s.query()
        y.backward(torch.ones_like(y))
    y_cpu = torch.softmax(x, 1) * torch.log_softmax(x, 0)
    y_cpu.backward(torch.ones_like(y_cpu))
    torch.testing.assert_close(y.detach().cpu(), y_cpu.detach())
    torch.testing.assert_close(d.grad.cpu(), x.grad)
    with pytest.raises(RuntimeError):          # integer input: an error at the call, as on the CPU
        torch.ops.aten._softmax(torch.ones(3, dtype=torch.long, device="mydev"), 0, False)


@pytest.mark.parametrize("fn", [torch.sigmoid, torch.tanh, torch.exp, torch.nn.functional.silu,
                                torch.nn.functional.gelu, lambda t: torch.softmax(t, -1),
                                lambda t: torch.log_softmax(t, 0), lambda t: t @ t.t()],
                         ids=["sigmoid", "tanh", "exp", "silu", "gelu", "softmax", "log_softmax", "mm"])
def test_queued_kernels_keep_second_derivatives(fn):
    # A PrivateUse1 kernel must not hide an op's autograd formula or decomposition.
    x = torch.randn(3, 4, dtype=torch.float64, device="mydev", requires_grad=True)
    assert torch.autograd.gradgradcheck(fn, (x,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_binary_ops_with_python_numbers_keep_cpu_numerics(dtype):
    # Half and bfloat16 loops compute in float with the number as a float; the
    # number must not be rounded to the tensor's dtype first (3.14 -> 3.140625).
    x = torch.randn(64).to(dtype)
    d = x.to("mydev")
    for got, want in [(d * 3.14, x * 3.14), (d + 0.1, x + 0.1), (d / 3.0, x / 3.0), (d - 1e-3, x - 1e-3)]:
        assert torch.equal(got.cpu(), want)
    d.mul_(3.14)
    assert torch.equal(d.cpu(), x.mul_(3.14))


def test_sync_debug_mode_reports_operations_that_wait_for_the_device():
    # As torch.cuda.set_sync_debug_mode: implicit synchronisations warn or
    # raise; queued work and explicit synchronisations do not.
    x = torch.randn(64, device="mydev")
    assert torch.mydev.get_sync_debug_mode() == 0
    try:
        torch.mydev.set_sync_debug_mode("warn")
        assert torch.mydev.get_sync_debug_mode() == 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = torch.sort(x * 2 + 1).values.cumsum(0)   # all queued
            torch.mydev.synchronize()
        assert not [w for w in caught if "synchronizing" in str(w.message)]
        for sync in (lambda: y.cpu(), lambda: y[3].item(), lambda: (x > 0).nonzero(),
                     lambda: torch.ones(3).to("mydev")):
            with pytest.warns(UserWarning, match="called a synchronizing mydev operation"):
                sync()
        torch.mydev.set_sync_debug_mode(2)
        with pytest.raises(RuntimeError, match="called a synchronizing mydev operation"):
            y.sum().item()
        with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
            torch.mydev.set_sync_debug_mode("loud")
        assert torch.mydev.get_sync_debug_mode() == 2
    finally:
        torch.mydev.set_sync_debug_mode("default")
    torch.testing.assert_close(y.cpu(), torch.sort(x.cpu() * 2 + 1).values.cumsum(0))


@pytest.mark.parametrize("knob", ["", "torch"], ids=["default", "MYDEV_KERNEL_THREADS=torch"])
@pytest.mark.parametrize("threads", [1, 3])  # (neither is OpenMP's default on a 2-core machine)
def test_stream_workers_take_the_intra_op_thread_setting(python_subprocess, threads, knob):
    # OpenMP's thread count is per thread: a worker that ran a matrix product before any parallel_for
    # used every core under torch.set_num_threads(1). A kernel takes its count at the launch
    # (kernel_intra_op_threads in core/ComputeUnits.h): torch's, or one fewer than the cores when it asks for
    # them all, so that the kernel's team and the dispatching host thread fit on the cores.
    cores = len(os.sched_getaffinity(0))
    want = threads if threads < cores or knob else max(1, cores - 1)
    r = python_subprocess(env={"MYDEV_KERNEL_THREADS": knob}, code=f"""
        import torch, my_device
        torch.set_num_threads({threads})
        a, w = torch.randn(64, 512), torch.randn(512, 256)
        side = torch.mydev.Stream()            # a new stream: a new worker
        with torch.mydev.stream(side):
            out = torch.mm(a.to("mydev"), w.to("mydev"))   # queued: too large to run at the call
            seen = my_device._C._test_worker_omp_threads(torch.mydev.current_device())
        torch.testing.assert_close(out.cpu(), torch.mm(a, w))
        print("threads", seen, my_device._C._kernel_intra_op_threads(), torch.get_num_threads())
    """)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"threads {want} {want} {threads}" in r.stdout, r.stdout + r.stderr


def test_a_bad_kernel_threads_setting_is_a_clear_error(python_subprocess):
    r = python_subprocess("""
        import torch, my_device
        try:
            torch.ones(3, device="mydev") * 2
        except RuntimeError as e:
            print("refused:", e)
    """, env={"MYDEV_KERNEL_THREADS": "3"})
    assert "refused: MYDEV_KERNEL_THREADS: expected unset or 'torch', got '3'" in r.stdout, r.stdout + r.stderr


def test_a_kernels_intra_op_threads_do_not_depend_on_the_thread_that_runs_it():
    # Layer norm's backward splits its rows among the intra-op threads at any size, so its weight gradient's
    # rounding shows the count it ran with. At the call (short, idle stream), queued behind held-back work, and
    # replayed from a graph, the kernel gives the CPU's bits at the count taken at its launch.
    g = torch.Generator().manual_seed(0)
    x, w, b, dy = (torch.randn(s, generator=g) for s in ((64, 16), (16,), (16,), (64, 16)))

    def weight_grad(device):
        return layer_norm_weight_grad(*(t.to(device) for t in (x, w, b, dy)))

    def layer_norm_weight_grad(x, w, b, dy):
        w = w.detach().requires_grad_()
        out = torch.native_layer_norm(x, (16,), w, b, 1e-5)[0]
        return torch.autograd.grad(out, w, dy)[0]

    kernel, torch_threads = my_device._C._kernel_intra_op_threads(), torch.get_num_threads()
    try:
        torch.set_num_threads(kernel)
        want = weight_grad("cpu")
    finally:
        torch.set_num_threads(torch_threads)
    if kernel != torch_threads:  # (the input tells the two counts apart, so a kernel at torch's would fail)
        assert not torch.equal(weight_grad("cpu"), want)
    got = {"first call": weight_grad("mydev").cpu(), "at the call": weight_grad("mydev").cpu()}
    inputs = [t.to("mydev") for t in (x, w, b, dy)]
    with delayed(torch.mydev.current_stream()) as stream:
        queued = layer_norm_weight_grad(*inputs)
        assert not stream.query()
    got["queued"] = queued.cpu()
    side = torch.mydev.Stream()
    side.wait_stream(torch.mydev.current_stream())
    with torch.mydev.stream(side):
        layer_norm_weight_grad(*inputs)  # (a capture's first calls of a signature must have run)
        graph = torch.mydev.MyDevGraph()
        with torch.mydev.graph(graph):
            replayed = layer_norm_weight_grad(*inputs)
    graph.replay()
    got["replayed"] = replayed.cpu()
    for path, grad in got.items():
        assert torch.equal(grad, want), path
