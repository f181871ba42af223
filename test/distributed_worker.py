"""One rank of the multi-process tests in test_distributed.py.

Run as `python test/distributed_worker.py SUITE OUT_DIR` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set (by test_distributed.py, or by torchrun). Each check of the suite runs in turn and
its outcome goes to OUT_DIR/<suite>-rank<r>.json as {check: {"ok": bool, "detail": str}}; a check
that raises records the error and the suite goes on. References are the same computation on CPU
tensors over gloo, in the same process group.
"""
import faulthandler
import json
import os
import sys
import datetime
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

import my_device

# MCCL_TEST_CUDA_SCRIPT=1: the worker is a CUDA script run under transfer_to_mydev ("cuda" devices,
# torch.cuda.set_device, and the backend it names, "nccl").
CUDA_SCRIPT = os.environ.get("MCCL_TEST_CUDA_SCRIPT") == "1"
if CUDA_SCRIPT:
    import my_device.transfer_to_mydev  # noqa: F401
DEV = "cuda" if CUDA_SCRIPT else "mydev"
DTYPES = [torch.float32, torch.bfloat16, torch.int64]
HUNG_SECONDS = 8  # dying suite: how long rank 1 sleeps before it dies


class Checks:
    def __init__(self, path):
        self.results = {}
        self.path = path

    def run(self, name, fn):
        print(f"check {name}", file=sys.stderr, flush=True)  # names the check a crash happened in
        try:
            detail = fn()
            self.results[name] = {"ok": True, "detail": detail or ""}
        except Exception:
            self.results[name] = {"ok": False, "detail": traceback.format_exc()}
        self.save()

    def save(self):
        # after every check, so that a crash leaves the outcomes of the checks before it
        with open(self.path, "w") as f:
            json.dump(self.results, f)


def expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def expect_equal(got, want, what):
    got = got.cpu()
    expect(got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{list(got.shape)} != {want.dtype}{list(want.shape)}")
    expect(torch.equal(got, want), f"{what}: {got} != {want}")


def slow_stream():
    """The current stream, made to hold back each task a little, so that an operation that did
    not wait for queued kernels would read their inputs before they were written."""
    s = torch.mydev.current_stream()
    my_device._C._test_set_stream_delay(s.stream_id, s.device_index, 2000)
    return s


def fast(s):
    my_device._C._test_set_stream_delay(s.stream_id, s.device_index, 0)


def rank_input(rank, n, dtype, salt=0):
    # Small integers: exact in every dtype tested, different on each rank.
    return ((torch.arange(n) * (rank + 2) + salt + rank) % 13 - 6).to(dtype)


def on_device_late(cpu):
    """cpu's values on mydev, produced by kernels still queued when this returns."""
    d = torch.zeros(cpu.shape, dtype=cpu.dtype, device=DEV)
    d.add_(cpu.to(DEV))
    d.mul_(1)
    return d


# ---------------------------------------------------------------- collectives vs gloo on CPU
def collectives(checks, rank, world):
    n = 12
    for dtype in DTYPES:
        dn = str(dtype).replace("torch.", "")
        ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT]
        if dtype.is_floating_point:
            ops.append(dist.ReduceOp.AVG)
        else:
            ops += [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]

        def all_reduce():
            for op in ops:
                x = rank_input(rank, n, dtype)
                want = x.clone()
                dist.all_reduce(want, op=op)  # gloo, CPU
                s = slow_stream()
                d = on_device_late(x)
                dist.all_reduce(d, op=op)
                fast(s)
                expect_equal(d, want, f"all_reduce {op}")
            if dtype.is_floating_point:
                # PREMUL_SUM (FSDP's scaled sum; gloo has none): the sum of the inputs times the factor
                x = rank_input(rank, n, dtype)
                want = x.clone()
                dist.all_reduce(want)
                d = on_device_late(x)
                dist.all_reduce(d, op=dist._make_nccl_premul_sum(0.5))
                expect_equal(d, want * 0.5, "all_reduce PREMUL_SUM(0.5)")

        def broadcast():
            for root in range(world):
                x = rank_input(rank, n, dtype, salt=root)
                want = x.clone()
                dist.broadcast(want, src=root)
                s = slow_stream()
                d = on_device_late(x)
                dist.broadcast(d, src=root)
                fast(s)
                expect_equal(d, want, f"broadcast from {root}")

        def reduce():
            for root in range(world):
                x = rank_input(rank, n, dtype)
                want = x.clone()
                dist.reduce(want, dst=root)
                d = on_device_late(x)
                dist.reduce(d, dst=root)
                if rank == root:
                    expect_equal(d, want, f"reduce to {root}")

        def all_gather():
            x = rank_input(rank, n, dtype)
            want = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(want, x)
            s = slow_stream()
            got = [torch.empty(n, dtype=dtype, device=DEV) for _ in range(world)]
            dist.all_gather(got, on_device_late(x))
            fast(s)
            for i in range(world):
                expect_equal(got[i], want[i], f"all_gather [{i}]")
            want_t = torch.empty(world * n, dtype=dtype)
            dist.all_gather_into_tensor(want_t, x)
            got_t = torch.empty(world * n, dtype=dtype, device=DEV)
            dist.all_gather_into_tensor(got_t, on_device_late(x))
            expect_equal(got_t, want_t, "all_gather_into_tensor")

        def reduce_scatter():
            ops_rs = [dist.ReduceOp.SUM, dist.ReduceOp.MAX] + ([dist.ReduceOp.AVG] if dtype.is_floating_point else [])
            for op in ops_rs:
                x = rank_input(rank, world * n, dtype)
                want = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(want, x, op=op)
                s = slow_stream()
                got = torch.empty(n, dtype=dtype, device=DEV)
                dist.reduce_scatter_tensor(got, on_device_late(x), op=op)
                fast(s)
                expect_equal(got, want, f"reduce_scatter_tensor {op}")
                want_l = torch.empty(n, dtype=dtype)
                dist.reduce_scatter(want_l, list(x.chunk(world)), op=op)
                got_l = torch.empty(n, dtype=dtype, device=DEV)
                dist.reduce_scatter(got_l, list(on_device_late(x).chunk(world)), op=op)
                expect_equal(got_l, want_l, f"reduce_scatter {op}")

        def all_to_all():
            x = rank_input(rank, world * n, dtype)
            want = torch.empty_like(x)
            dist.all_to_all_single(want, x)
            got = torch.empty(world * n, dtype=dtype, device=DEV)
            dist.all_to_all_single(got, on_device_late(x))
            expect_equal(got, want, "all_to_all_single")
            # uneven splits: rank r sends r + 1 + i elements to rank i
            in_splits = [rank + 1 + i for i in range(world)]
            out_splits = [i + 1 + rank for i in range(world)]
            x = rank_input(rank, sum(in_splits), dtype)
            want = torch.empty(sum(out_splits), dtype=dtype)
            dist.all_to_all_single(want, x, out_splits, in_splits)
            got = torch.empty(sum(out_splits), dtype=dtype, device=DEV)
            dist.all_to_all_single(got, on_device_late(x), out_splits, in_splits)
            expect_equal(got, want, "all_to_all_single (uneven)")
            xs = [rank_input(rank, n, dtype, salt=i) for i in range(world)]
            want_l = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_to_all(want_l, xs)
            got_l = [torch.empty(n, dtype=dtype, device=DEV) for _ in range(world)]
            dist.all_to_all(got_l, [on_device_late(t) for t in xs])
            for i in range(world):
                expect_equal(got_l[i], want_l[i], f"all_to_all [{i}]")

        def gather_scatter():
            x = rank_input(rank, n, dtype)
            want = [torch.empty_like(x) for _ in range(world)] if rank == 0 else None
            dist.gather(x, want, dst=0)
            got = [torch.empty(n, dtype=dtype, device=DEV) for _ in range(world)] if rank == 0 else None
            dist.gather(on_device_late(x), got, dst=0)
            if rank == 0:
                for i in range(world):
                    expect_equal(got[i], want[i], f"gather [{i}]")
            src = [rank_input(i, n, dtype, salt=7) for i in range(world)] if rank == 1 else None
            want_s = torch.empty(n, dtype=dtype)
            dist.scatter(want_s, src, src=1)
            got_s = torch.empty(n, dtype=dtype, device=DEV)
            dist.scatter(got_s, [on_device_late(t) for t in src] if src else None, src=1)
            expect_equal(got_s, want_s, "scatter")

        def send_recv():
            x = rank_input(rank, n, dtype)
            peer = 1 - rank
            want = torch.empty(n, dtype=dtype)
            got = torch.empty(n, dtype=dtype, device=DEV)
            if rank == 0:
                dist.send(x, peer)
                dist.recv(want, peer)
                s = slow_stream()
                dist.send(on_device_late(x), peer)
                dist.recv(got, peer)
                fast(s)
            else:
                dist.recv(want, peer)
                dist.send(x, peer)
                s = slow_stream()
                dist.recv(got, peer)
                dist.send(on_device_late(x), peer)
                fast(s)
            expect_equal(got, want, "send/recv")

        def batch_isend_irecv():
            x = rank_input(rank, n, dtype)
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            want = torch.empty(n, dtype=dtype)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, want, prv)])
            for r in reqs:
                r.wait()
            got = torch.empty(n, dtype=dtype, device=DEV)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, on_device_late(x), nxt), dist.P2POp(dist.irecv, got, prv)])
            for r in reqs:
                r.wait()
            expect_equal(got, want, "batch_isend_irecv")

        def coalescing():
            xs = [rank_input(rank, n + i, dtype) for i in range(3)]
            wants = [x.clone() for x in xs]
            for w in wants:
                dist.all_reduce(w)
            ds = [on_device_late(x) for x in xs]
            with dist._coalescing_manager(async_ops=True) as cm:  # -> allreduce_coalesced
                for d in ds:
                    dist.all_reduce(d)
            cm.wait()
            for i in range(3):
                expect_equal(ds[i], wants[i], f"coalesced all_reduce [{i}]")
            outs = [torch.empty(world * (n + i), dtype=dtype, device=DEV) for i in range(3)]
            with dist._coalescing_manager(async_ops=True) as cm:  # -> allgather_into_tensor_coalesced
                for o, x in zip(outs, xs):
                    dist.all_gather_into_tensor(o, on_device_late(x))
            cm.wait()
            for i, x in enumerate(xs):
                want = torch.empty(world * (n + i), dtype=dtype)
                dist.all_gather_into_tensor(want, x)
                expect_equal(outs[i], want, f"coalesced all_gather_into_tensor [{i}]")
            # the NCCL-style form: startCoalescing / endCoalescing on the device's backend
            ds = [on_device_late(x) for x in xs]
            with dist._coalescing_manager(device=torch.device(DEV, rank), async_ops=True) as cm:
                for d in ds:
                    dist.all_reduce(d)
            cm.wait()
            for i in range(3):
                expect_equal(ds[i], wants[i], f"coalesced (device) all_reduce [{i}]")

        for name, fn in [("all_reduce", all_reduce), ("broadcast", broadcast), ("reduce", reduce),
                         ("all_gather", all_gather), ("reduce_scatter", reduce_scatter),
                         ("all_to_all", all_to_all), ("gather_scatter", gather_scatter),
                         ("send_recv", send_recv), ("batch_isend_irecv", batch_isend_irecv),
                         ("coalescing", coalescing)]:
            checks.run(f"{name}[{dn}]", fn)

    def barrier():
        # rank 1 arrives late; rank 0 must not leave the barrier before it arrives. With
        # device_ids the barrier runs on mccl (without, this group would use its CPU backend).
        for _ in range(2):
            if rank == 1:
                time.sleep(0.5)
            t0 = time.monotonic()
            dist.barrier(device_ids=[torch.mydev.current_device()])
            waited = time.monotonic() - t0
            if rank == 0:
                expect(waited > 0.3, f"barrier returned after {waited:.3f} s, before rank 1 arrived")
        # wait(timeout) bounds the host's wait: rank 0 gives up before rank 1 arrives, with an error
        # naming the collective, and the barrier still completes when waited for again.
        if rank == 1:
            time.sleep(0.5)
        work = dist.barrier(device_ids=[torch.mydev.current_device()], async_op=True)
        if rank == 0:
            try:
                work.wait(timeout=datetime.timedelta(milliseconds=100))
                expect(False, "wait(timeout=100ms) returned before rank 1 arrived")
            except RuntimeError as e:
                expect("mccl barrier: wait timed out after 100ms" in str(e), f"unexpected error: {e}")
        work.wait()

    checks.run("barrier", barrier)


# ---------------------------------------------------------------- Work semantics
def work_semantics(checks, rank, world):
    def async_work():
        # The collective is queued behind slow kernels: the call and wait() return at once
        # (the host does not wait), the Work completes later, and the stream sees the result.
        s = torch.mydev.current_stream()
        x = rank_input(rank, 1000, torch.float32)
        my_device._C._test_set_stream_delay(s.stream_id, s.device_index, 100_000)
        try:
            d = on_device_late(x)
            t0 = time.monotonic()
            work = dist.all_reduce(d, async_op=True)
            work.wait()
            y = d * 2  # queued after the collective
            elapsed = time.monotonic() - t0
            completed_early = work.is_completed()
        finally:
            my_device._C._test_set_stream_delay(s.stream_id, s.device_index, 0)
        want = x.clone()
        dist.all_reduce(want)
        expect(elapsed < 0.2, f"all_reduce + wait() blocked the host for {elapsed:.3f} s")
        expect(not completed_early, "the Work completed before the kernels it depends on ran")
        expect_equal(y, want * 2, "result seen by a kernel queued after wait()")
        torch.mydev.synchronize()
        expect(work.is_completed() and work.is_success(), "the Work did not complete")
        fut = dist.all_reduce(on_device_late(x), async_op=True).get_future()
        expect_equal(fut.wait()[0], want, "the Work's Future value")

    def bad_input():
        x = torch.ones(4, 4, device=DEV)
        try:
            dist.all_reduce(x.t())
        except RuntimeError as e:
            expect("mccl all_reduce" in str(e) and "contiguous" in str(e), f"unclear error: {e}")
        else:
            raise AssertionError("a non-contiguous tensor was accepted")
        try:
            dist.all_gather_into_tensor(torch.empty(3, device=DEV), torch.ones(2, device=DEV))
        except (RuntimeError, ValueError) as e:
            expect("all_gather_into_tensor" in str(e), f"unclear error: {e}")
        else:
            raise AssertionError("a wrong output size was accepted")
        try:
            dist.all_reduce(torch.ones(4, dtype=torch.int64, device=DEV), op=dist.ReduceOp.AVG)
        except RuntimeError as e:
            expect("mccl all_reduce" in str(e) and "AVG" in str(e), f"unclear error: {e}")
        else:
            raise AssertionError("ReduceOp.AVG of integers was accepted")
        try:
            dist.send(torch.ones(2, device=DEV), dst=world)
        except (RuntimeError, ValueError) as e:
            expect("rank" in str(e), f"unclear error: {e}")
        else:
            raise AssertionError("a destination rank out of range was accepted")
        # the group and the device still work
        y = torch.full((4,), float(rank + 1), device=DEV)
        dist.all_reduce(y)
        expect_equal(y, torch.full((4,), 3.0), "all_reduce after an error")

    def p2p_stress():
        # 200 transfers, each of data written by kernels still queued when send is called,
        # into a buffer that kernels read right after recv returns.
        s = torch.mydev.current_stream()
        wrong = 0
        my_device._C._test_set_stream_delay(s.stream_id, s.device_index, 200)
        try:
            results = []
            for i in range(200):
                if rank == 0:
                    d = torch.full((256,), float(i), device=DEV)
                    d.mul_(2).add_(1)
                    dist.send(d, 1)
                else:
                    buf = torch.full((256,), -1.0, device=DEV)
                    dist.recv(buf, 0)
                    results.append(buf.sum())
        finally:
            my_device._C._test_set_stream_delay(s.stream_id, s.device_index, 0)
        if rank == 1:
            sums = torch.stack(results).cpu()
            want = torch.tensor([256.0 * (2 * i + 1) for i in range(200)])
            wrong = int((sums != want).sum())
        expect(wrong == 0, f"{wrong} of 200 transfers delivered wrong data")
        return "200 transfers, 0 wrong"

    def gloo_refuses_mydev():
        g = dist.new_group(backend="cpu:gloo,mydev:gloo")
        x = torch.ones(8, device=DEV)
        for name, call in [("send", lambda: dist.send(x, 1 - rank, group=g)),
                           ("recv", lambda: dist.recv(x, 1 - rank, group=g)),
                           ("all_reduce", lambda: dist.all_reduce(x, group=g))]:
            try:
                call()
            except RuntimeError as e:
                expect("mccl" in str(e) and "gloo" in str(e), f"{name}: unclear error: {e}")
            else:
                raise AssertionError(f"gloo {name} of a mydev tensor was accepted")
        c = torch.full((8,), float(rank), dtype=torch.float32)
        dist.all_reduce(c, group=g)  # CPU tensors still go to gloo
        expect_equal(c, torch.full((8,), 1.0), "gloo all_reduce of CPU tensors")
        expect_equal(x * 2, torch.full((8,), 2.0), "the device after the refusal")
        dist.destroy_process_group(g)

    def gloo_only_group_points_to_mccl():
        g = dist.new_group(backend="gloo")
        try:
            dist.all_reduce(torch.ones(2, device=DEV), group=g)
        except RuntimeError as e:
            expect("mccl" in str(e), f"unclear error: {e}")
        else:
            raise AssertionError("a gloo-only group accepted a mydev tensor")
        # The refusal needs no peer: without a collective first, one rank could destroy the group (closing its
        # sockets) while the other was still connecting to it ("Connection closed by peer" in new_group).
        dist.barrier(group=g)
        dist.destroy_process_group(g)

    def wait_with_a_timeout_waits_on_the_host():
        # As NCCL's Work.wait(timeout): the host waits, and raises once the timeout has passed.
        peer = 1 - rank
        buf = torch.zeros(4, device=DEV)
        if rank == 0:
            work = dist.irecv(buf, src=peer)
            try:
                work.wait(timeout=timedelta(milliseconds=200))
            except RuntimeError as e:
                expect("wait timed out after 200ms" in str(e), f"unexpected error: {e}")
            else:
                raise AssertionError("wait(timeout=200ms) returned before the peer sent anything")
            dist.barrier(device_ids=None)        # lets the peer send
            work.wait()
            expect_equal(buf, torch.full((4,), 7.0), "the message received after the timed-out wait")
        else:
            dist.barrier(device_ids=None)
            dist.send(torch.full((4,), 7.0, device=DEV), dst=peer)
        torch.mydev.synchronize()

    checks.run("async_work", async_work)
    checks.run("wait_with_a_timeout_waits_on_the_host", wait_with_a_timeout_waits_on_the_host)
    checks.run("bad_input", bad_input)
    checks.run("p2p_stress", p2p_stress)
    checks.run("gloo_refuses_mydev", gloo_refuses_mydev)
    checks.run("gloo_only_group_points_to_mccl", gloo_only_group_points_to_mccl)


# ---------------------------------------------------------------- training
def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def batches(steps=5, size=8):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(size, 16, generator=g), torch.randn(size, 8, generator=g)) for _ in range(steps)]


def reference_training(data, lr=0.1):
    """Single process, full batch, on CPU."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in data:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def training(checks, rank, world):
    data = batches()
    want = reference_training(data)

    def ddp():
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(make_model().to(DEV))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for x, y in data:
            xs, ys = x.chunk(world)[rank].to(DEV), y.chunk(world)[rank].to(DEV)
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(xs), ys)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        for p, w in zip(model.parameters(), want):
            torch.testing.assert_close(p.detach().cpu(), w, rtol=1e-5, atol=1e-6)
        return f"losses {[round(v, 5) for v in losses]}"

    def fsdp2():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(DEV, (world,))
        model = make_model().to(DEV)
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in data:
            xs, ys = x.chunk(world)[rank].to(DEV), y.chunk(world)[rank].to(DEV)
            opt.zero_grad()
            nn.functional.mse_loss(model(xs), ys).backward()
            opt.step()
        for p, w in zip(model.parameters(), want):
            torch.testing.assert_close(p.full_tensor().detach().cpu(), w, rtol=1e-5, atol=1e-6)

    def dtensor():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = init_device_mesh(DEV, (world,))
        torch.manual_seed(2)
        x, w = torch.randn(6, 16), torch.randn(16, 10)
        want_y = x @ w
        xd = distribute_tensor(x.to(DEV), mesh, [Replicate()])
        for placement in (Shard(0), Shard(1)):
            wd = distribute_tensor(w.to(DEV), mesh, [placement])
            y = (xd @ wd).full_tensor()
            torch.testing.assert_close(y.cpu(), want_y, rtol=1e-5, atol=1e-5)

    checks.run("ddp", ddp)
    checks.run("dtensor", dtensor)
    checks.run("fsdp2", fsdp2)


# ---------------------------------------------------------------- failures
def dying_peer(checks, rank, world):
    """Rank 1 stops taking part (it sleeps), then dies. Rank 0's collectives must fail with an error
    naming the collective and the rank: while rank 1 sleeps, within the group's timeout
    (MCCL_TEST_TIMEOUT); once it died, at once."""
    if rank == 1:
        time.sleep(HUNG_SECONDS)
        os._exit(3)
    timeout = float(os.environ["MCCL_TEST_TIMEOUT"])

    def times_out():
        x = torch.ones(1 << 10, device=DEV)
        t0 = time.monotonic()
        work = dist.all_reduce(x, async_op=True)
        try:
            work.wait()
            x.sum().item()
        except Exception as e:  # noqa: BLE001
            elapsed = time.monotonic() - t0
            msg = str(e)
            expect("mccl all_reduce" in msg and "rank 0" in msg, f"unclear error: {msg}")
            expect(elapsed < HUNG_SECONDS - 1, f"failed only after {elapsed:.1f} s (timeout {timeout} s)")
            expect(isinstance(work.exception(), Exception), "the Work does not hold the failure")
            return f"failed after {elapsed:.2f} s: {msg.splitlines()[0][:200]}"
        raise AssertionError("all_reduce with a silent peer did not fail")

    checks.run("hung_peer", times_out)
    time.sleep(max(0.0, HUNG_SECONDS + 1 - timeout))  # rank 1 is gone by now

    def fails_clearly():
        x = torch.ones(1 << 16, device=DEV)
        t0 = time.monotonic()
        try:
            for _ in range(3):  # the first may be queued before the peer's connection is gone
                dist.all_reduce(x)
                x.sum().item()
        except Exception as e:  # noqa: BLE001
            elapsed = time.monotonic() - t0
            msg = str(e)
            expect("mccl all_reduce" in msg and "rank 0" in msg, f"unclear error: {msg}")
            expect(elapsed < 20, f"failed only after {elapsed:.1f} s")
            # the device still works
            expect_equal(torch.ones(3, device=DEV) + 1, torch.full((3,), 2.0), "the device after the failure")
            return f"failed after {elapsed:.2f} s: {msg.splitlines()[0][:200]}"
        raise AssertionError("all_reduce with a dead peer did not fail")

    checks.run("dying_peer", fails_clearly)


SUITES = {
    "main": [collectives, work_semantics, training],
    "dying": [dying_peer],
    "torchrun": [training],
}


def main():
    faulthandler.enable()
    suite, out_dir = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    (torch.cuda if CUDA_SCRIPT else torch.mydev).set_device(local_rank)
    backend = os.environ.get("MCCL_TEST_BACKEND", "cpu:gloo,mydev:mccl") or None  # "": the default
    dist.init_process_group(backend, timeout=timedelta(seconds=float(os.environ.get("MCCL_TEST_TIMEOUT", "30"))))
    checks = Checks(os.path.join(out_dir, f"{suite}-rank{rank}.json"))
    checks.results["_backend"] = {"ok": True, "detail": str(dist.get_backend_config())}
    for part in SUITES[suite]:
        part(checks, rank, world)
    checks.results["_finished"] = {"ok": True, "detail": ""}
    checks.save()
    if suite == "dying":
        os._exit(0)  # the group has lost a rank: leave without tearing it down
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
