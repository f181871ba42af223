"""The caching allocator: exact statistics for known allocation patterns, reuse, splitting, limits."""
import gc
import pytest
import torch

import my_device

MiB = 1 << 20


def test_exact_statistics_for_known_patterns(python_subprocess):
    # A fresh process, so that nothing cached by other tests skews the counts.
    r = python_subprocess("""
        import torch, my_device
        MiB = 1 << 20
        m = torch.mydev
        def state():
            s = m.memory_stats()
            return (s["allocated_bytes.all.current"], s["reserved_bytes.all.current"], s["num_device_alloc"],
                    s["segment.all.current"])
        assert state() == (0, 0, 0, 0), state()

        a = torch.empty(4 * MiB, dtype=torch.uint8, device="mydev")
        assert state() == (4 * MiB, 4 * MiB, 1, 1), state()
        del a                                                     # freed to the cache, not the runtime
        assert state() == (0, 4 * MiB, 1, 1), state()
        b = torch.empty(4 * MiB, dtype=torch.uint8, device="mydev")
        assert state() == (4 * MiB, 4 * MiB, 1, 1), state()      # reused: no new runtime allocation
        c = torch.empty(2 * MiB, dtype=torch.uint8, device="mydev")
        assert state() == (6 * MiB, 6 * MiB, 2, 2), state()
        assert m.max_memory_allocated() == 6 * MiB and m.max_memory_reserved() == 6 * MiB
        del b, c
        assert m.memory_allocated() == 0 and m.max_memory_allocated() == 6 * MiB
        m.reset_peak_memory_stats()
        assert m.max_memory_allocated() == 0 and m.max_memory_reserved() == 6 * MiB
        m.empty_cache()
        assert state() == (0, 0, 2, 0), state()
        assert m.memory_stats()["num_device_free"] == 2

        # Small requests round to 512 bytes and share one 2 MiB segment.
        x = torch.empty(100, device="mydev")                      # 400 bytes
        y = torch.empty(200, device="mydev")                      # 800 bytes
        assert state() == (512 + 1024, 2 * MiB, 3, 1), state()
        assert m.memory_stats()["requested_bytes.all.current"] == 1200
        assert m.memory_stats()["allocated_bytes.small_pool.current"] == 1536
        del x, y
        m.empty_cache()
        assert state() == (0, 0, 3, 0), state()

        # A cached 10 MiB segment is split to serve 4 MiB, then 6 MiB; freed, it merges back whole.
        big = torch.empty(10 * MiB, dtype=torch.uint8, device="mydev")
        del big
        p = torch.empty(4 * MiB, dtype=torch.uint8, device="mydev")
        q = torch.empty(6 * MiB, dtype=torch.uint8, device="mydev")
        assert state() == (10 * MiB, 10 * MiB, 4, 1), state()
        del p, q
        m.empty_cache()                                            # only whole segments are released
        assert state() == (0, 0, 4, 0), state()

        # Blocks are cached per stream: another stream does not reuse them.
        t = torch.empty(4 * MiB, dtype=torch.uint8, device="mydev")
        del t
        s = m.Stream()
        with m.stream(s):
            u = torch.empty(4 * MiB, dtype=torch.uint8, device="mydev")
        assert state() == (4 * MiB, 8 * MiB, 6, 2), state()
        del u
        v = torch.empty(4 * MiB, dtype=torch.uint8, device="mydev")  # the default stream's block again
        assert state() == (4 * MiB, 8 * MiB, 6, 2), state()
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_cache_reuse_returns_the_same_memory():
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="mydev:1")
    ptr = x.data_ptr()
    reserved = torch.mydev.memory_reserved(1)
    del x
    y = torch.empty(3 * MiB, dtype=torch.uint8, device="mydev:1")
    assert y.data_ptr() == ptr
    assert torch.mydev.memory_reserved(1) == reserved


def test_a_free_returns_the_block_to_its_own_device():
    # Each device's DataPtrs carry a deleter of that device (Allocator.cpp):
    # whichever device is current, and whether the tensor or a raw-allocated
    # block is freed, the bytes go back to the device they came from.
    base = [torch.mydev.memory_allocated(d) for d in (0, 1)]
    x = torch.ones(1000, device="mydev:1")
    y = torch.ones(1000, device="mydev:0")
    assert [torch.mydev.memory_allocated(d) - base[d] for d in (0, 1)] == [4096, 4096]
    # A queued kernel holds blocks under KernelArgs::kLeaseMinBytes by
    # reference until it has run (KernelArgs.h): the ones() fills ran at the
    # call on an idle stream, but on a stream still busy with an earlier
    # test's work they were queued, and `del` alone would not free the block.
    torch.mydev.synchronize(0)
    torch.mydev.synchronize(1)
    with torch.mydev.device(0):
        del x
    assert [torch.mydev.memory_allocated(d) - base[d] for d in (0, 1)] == [4096, 0]
    with torch.mydev.device(1):
        del y
        raw = torch.mydev.caching_allocator_alloc(512, device=0)
    assert [torch.mydev.memory_allocated(d) - base[d] for d in (0, 1)] == [512, 0]
    with torch.mydev.device(1):
        torch.mydev.caching_allocator_delete(raw)
    assert [torch.mydev.memory_allocated(d) - base[d] for d in (0, 1)] == [0, 0]
    z = torch.ones(3, device="mydev:1") + 1  # both devices still allocate and compute
    assert torch.equal(z.cpu(), torch.full((3,), 2.0))


def test_caching_allocator_alloc_and_delete():
    base = torch.mydev.memory_allocated(0)
    side = torch.mydev.Stream()
    ptr = torch.mydev.caching_allocator_alloc(1000, device=0, stream=side)
    assert ptr != 0 and torch.mydev.memory_allocated(0) - base == 1024
    with pytest.raises(RuntimeError, match="invalid device pointer"):
        torch.mydev.caching_allocator_delete(ptr + 8)  # not the start of a block: nothing is freed
    assert torch.mydev.memory_allocated(0) - base == 1024
    with pytest.raises(TypeError, match="stream"):
        torch.mydev.caching_allocator_alloc(16, stream=3)
    torch.mydev.caching_allocator_delete(ptr)
    assert torch.mydev.memory_allocated(0) == base
    x = torch.arange(4.0, device="mydev") * 2
    assert torch.equal(x.cpu(), torch.arange(4.0) * 2)


def test_memory_summary_and_accelerator_api():
    x = torch.empty(MiB, dtype=torch.uint8, device="mydev")
    summary = torch.mydev.memory_summary()
    assert "Allocated memory" in summary and "mydev memory summary, device ID 0" in summary
    # Earlier tests' tensors may still be freed meanwhile (a queued kernel's scratch, an autograd device
    # thread dropping its graph): compare readings taken while the counters stood still.
    torch.mydev.synchronize()
    gc.collect()
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
        for _ in range(5):
            before = getattr(torch.accelerator, name)(0)
            mine = getattr(torch.mydev, name)(0)
            if getattr(torch.accelerator, name)(0) == before:
                break
        assert mine == before, name
    free, total = torch.mydev.mem_get_info()
    assert total == 8 * (1 << 30) and 0 < free <= total
    del x


def test_oom_message_and_fraction(python_subprocess):
    r = python_subprocess("""
        import torch, my_device
        MiB = 1 << 20
        assert torch.mydev.get_per_process_memory_fraction() == 1.0
        torch.mydev.set_per_process_memory_fraction(0.5)          # 16 MiB of 32
        assert torch.mydev.get_per_process_memory_fraction() == 0.5
        assert torch.mydev.get_per_process_memory_fraction(1) == 1.0
        keep = torch.ones(4 * MiB, dtype=torch.uint8, device="mydev")
        assert torch.mydev.device_memory_used() >= 4 * MiB
        try:
            torch.empty(14 * MiB, dtype=torch.uint8, device="mydev")
        except torch.OutOfMemoryError as e:
            msg = str(e)
        else:
            raise SystemExit("fraction not enforced")
        assert "Tried to allocate 14.00 MiB" in msg, msg
        assert "total capacity of 32.00 MiB" in msg and "4.00 MiB is allocated by PyTorch" in msg, msg
        assert "set_per_process_memory_fraction" in msg, msg
        torch.mydev.set_per_process_memory_fraction(1.0)
        ok = torch.empty(14 * MiB, dtype=torch.uint8, device="mydev")
        assert keep.min().item() == 1
        assert torch.mydev.memory_stats()["num_ooms"] == 1
        print("ok")
    """, env={"MYDEV_MEMORY_LIMIT": "32M"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_fraction_is_validated():
    with pytest.raises(RuntimeError, match="invalid fraction"):
        torch.mydev.set_per_process_memory_fraction(1.5)


def test_oom_inside_a_kernel_raises_and_device_still_works(python_subprocess):
    r = python_subprocess("""
        import torch, my_device
        MiB = 1 << 20
        a = torch.ones(6 * MiB, device="mydev")                    # 24 MiB of 32
        try:
            a.exp()                                                 # its output does not fit
        except torch.OutOfMemoryError:
            pass
        else:
            raise SystemExit("no OOM")
        assert a.sum().item() == 6 * MiB
        del a
        assert torch.ones(3 * MiB, device="mydev").exp().min().item() > 2.7
        print("ok")
    """, env={"MYDEV_MEMORY_LIMIT": "32M"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_lazy_clones_materialise_in_stream_order_without_deadlock(python_subprocess):
    # A write to a lazy clone (copy-on-write) copies the shared bytes while
    # holding the shared storage's lock; a queued kernel that materialises
    # another clone of the same storage takes that lock too. The copy must not
    # wait for the device under it (it hung the process). Run apart, so that a
    # hang fails on the timeout.
    r = python_subprocess("""
        import sys
        sys.path.insert(0, "test")
        import torch, my_device
        from conftest import delayed
        x = torch.randn(64, 768, device="mydev")
        w = torch.randn(768, device="mydev")
        torch.cumsum(w, 0)                   # a host kernel: later calls are queued
        wc = torch._lazy_clone(w)
        with delayed(torch.mydev.default_stream(), us=20000):
            a = torch.cumsum(w, 0)           # queued; materialises w when it runs
            b = torch.native_layer_norm(x, (768,), wc, None, 1e-5)  # materialises wc now
            wc.add_(1)                       # written: wc has bytes of its own
        want = torch.native_layer_norm(x.cpu(), (768,), w.cpu(), None, 1e-5)[0]
        assert torch.equal(b[0].cpu(), want)
        assert torch.equal(a.cpu(), torch.cumsum(w.cpu(), 0))
        assert torch.equal(wc.cpu(), w.cpu() + 1)
        # A lazy clone of a tensor a queued kernel still writes: the copy comes after it.
        y = torch.zeros(4096, device="mydev")
        with delayed(torch.mydev.default_stream(), us=20000):
            y.add_(3)
            yc = torch._lazy_clone(y)
            yc.mul_(2)
        assert yc.cpu().eq(6).all() and y.cpu().eq(3).all()
        print("ok")
    """, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr[-3000:]


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
@pytest.mark.parametrize("name,op", [
    ("host_kernel", lambda t: torch.cumsum(t, 0)),
    ("structured", lambda t: torch.softmax(t, -1)),
    ("iterator", lambda t: t + 1),
    ("layer_norm", lambda t: torch.nn.functional.layer_norm(t, t.shape[-1:])),
    ("clone", lambda t: t.clone()),                      # a copy's source
    ("strided_copy", lambda t: t.t().contiguous()),
])
@pytest.mark.parametrize("n", [16, 4096])
def test_ops_that_read_a_lazy_clone_leave_it_shared(name, op, n, busy):
    # As on the CPU: reading a copy-on-write tensor copies nothing; writing it does, and only it.
    from conftest import delayed
    base = torch.randn(4, n)
    x = base.to("mydev")
    op(x)  # a host kernel's first call of a signature runs at the call
    torch.mydev.synchronize()
    y = torch._lazy_clone(x)
    stream = torch.mydev.default_stream()
    with delayed(stream, us=20_000 if busy else 0):
        got = op(y)
    assert torch._C._is_cow_tensor(x) and torch._C._is_cow_tensor(y)
    torch.testing.assert_close(got.cpu(), op(base), rtol=0, atol=0)
    with delayed(stream, us=20_000 if busy else 0):
        y.mul_(2)
    assert not torch._C._is_cow_tensor(y)
    assert torch.equal(y.cpu(), base * 2) and torch.equal(x.cpu(), base)


def test_batch_norm_updates_a_lazily_cloned_running_mean_alone(kernel_threads):
    # native_batch_norm writes its running statistics, which its schema does not mark as written: the
    # host kernel gives them bytes of their own like any written argument (HostKernel.cpp).
    x = torch.randn(8, 3)
    mean, var = torch.zeros(3), torch.ones(3)
    want_mean, want_var = mean.clone(), var.clone()
    want = torch.nn.functional.batch_norm(x, want_mean, want_var, training=True)
    dev_mean, dev_var = mean.to("mydev"), var.to("mydev")
    clone_mean, clone_var = torch._lazy_clone(dev_mean), torch._lazy_clone(dev_var)
    got = torch.nn.functional.batch_norm(x.to("mydev"), clone_mean, clone_var, training=True)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    assert torch.equal(clone_mean.cpu(), want_mean) and torch.equal(clone_var.cpu(), want_var)
    assert torch.equal(dev_mean.cpu(), mean) and torch.equal(dev_var.cpu(), var)


def test_native_batch_norm_schema_still_leaves_its_running_statistics_unannotated():
    # When PyTorch annotates them (Tensor(a!)), HostKernel.cpp's writes_unannotated can go.
    args = {a.name: a for a in torch.ops.aten.native_batch_norm.default._schema.arguments}
    assert args["running_mean"].alias_info is None and args["running_var"].alias_info is None
