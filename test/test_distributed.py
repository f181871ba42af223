"""torch.distributed on mydev with the mccl backend, on 2 processes.

Each suite of test/distributed_worker.py runs once per module on two ranks (a process launch
costs seconds, so the checks share it); every test below asserts the outcome of one check on
both ranks. References: the same collective on CPU tensors over gloo in the same process group,
and single-process training on the full batch.
"""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import my_device  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "test", "distributed_worker.py")
WORLD = 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(**extra):
    # The worker runs as a script (sys.path[0] is test/): this checkout's my_device must come first.
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", **extra)


def launch(suite, tmp_path, env=None, timeout=240):
    """Runs `suite` on WORLD ranks; returns ({rank: {check: result}}, [returncodes], [stderr])."""
    port = free_port()
    procs = []
    for rank in range(WORLD):
        full_env = worker_env(RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(port), **(env or {}))
        procs.append(subprocess.Popen([sys.executable, WORKER, suite, str(tmp_path)], env=full_env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = {}
    for rank in range(WORLD):
        path = tmp_path / f"{suite}-rank{rank}.json"
        if path.exists():
            results[rank] = json.loads(path.read_text())
    return results, [p.returncode for p in procs], [err for _, err in outputs]


@pytest.fixture(scope="module")
def main_suite(tmp_path_factory):
    results, codes, errs = launch("main", tmp_path_factory.mktemp("main"))
    assert codes == [0] * WORLD and len(results) == WORLD, f"ranks exited {codes}:\n" + "\n".join(e[-3000:] for e in errs)
    return results


def outcome(results, check):
    for rank, checks in results.items():
        assert check in checks, f"rank {rank} did not run {check}"
        assert checks[check]["ok"], f"rank {rank}: {check} failed:\n{checks[check]['detail']}"


def test_registration():
    assert "mccl" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["mydev"] == "mccl"
    assert dist.get_default_backend_for_device("mydev") == "mccl"
    assert dist.Backend.backend_capability["mccl"] == ["mydev"]


def _init_single_rank_default_group():
    dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1)  # no backend: the accelerator's


def test_init_process_group_without_backend_uses_mccl_as_default():
    _init_single_rank_default_group()
    try:
        pg = dist.group.WORLD
        assert str(dist.get_backend_config()) == "mydev:mccl"
        # DDP's constructor asks the group for its default backend
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2).to("mydev"))
        assert model(torch.ones(3, 4, device="mydev")).shape == (3, 2)
        x = torch.arange(4.0, device="mydev")
        dist.all_reduce(x)
        assert torch.equal(x.cpu(), torch.arange(4.0))
    finally:
        dist.destroy_process_group()


def test_torch_still_needs_the_default_backend_fix():
    # my_device.distributed._fix_default_backend works around torch 2.13 giving a group created
    # without a backend the default backend type GLOO; when this fails, torch no longer does, and
    # the workaround can go.
    c10d = dist.distributed_c10d
    wrapped = c10d._new_process_group_helper
    c10d._new_process_group_helper = wrapped._torch_original
    try:
        _init_single_rank_default_group()
        with pytest.raises(RuntimeError, match="Could not find the default backend type"):
            dist.group.WORLD._get_sequence_number_for_group()
    finally:
        c10d._new_process_group_helper = wrapped
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
@pytest.mark.parametrize("collective", ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                                        "all_to_all", "gather_scatter", "send_recv", "batch_isend_irecv",
                                        "coalescing"])
def test_collective_equals_gloo_on_cpu(main_suite, collective, dtype):
    outcome(main_suite, f"{collective}[{dtype}]")


def test_barrier_waits_for_every_rank(main_suite):
    outcome(main_suite, "barrier")


def test_work_is_asynchronous_and_stream_ordered(main_suite):
    outcome(main_suite, "async_work")


def test_wait_with_a_timeout_waits_on_the_host_and_raises_after_it(main_suite):
    outcome(main_suite, "wait_with_a_timeout_waits_on_the_host")


def test_bad_input_raises_at_the_call_and_the_group_still_works(main_suite):
    outcome(main_suite, "bad_input")


def test_200_transfers_after_queued_kernels_none_wrong(main_suite):
    outcome(main_suite, "p2p_stress")


def test_gloo_refuses_mydev_tensors_pointing_to_mccl(main_suite):
    outcome(main_suite, "gloo_refuses_mydev")


def test_gloo_only_group_error_points_to_mccl(main_suite):
    outcome(main_suite, "gloo_only_group_points_to_mccl")


def test_ddp_matches_single_process_full_batch(main_suite):
    outcome(main_suite, "ddp")


def test_fsdp2_matches_single_process_full_batch(main_suite):
    outcome(main_suite, "fsdp2")


def test_dtensor_matmul_with_sharded_weight(main_suite):
    outcome(main_suite, "dtensor")


def test_process_group_has_gloo_for_cpu_and_mccl_for_mydev(main_suite):
    for rank in range(WORLD):
        assert main_suite[rank]["_backend"]["detail"] in ("cpu:gloo,mydev:mccl", "mydev:mccl,cpu:gloo")


@pytest.mark.slow
def test_silent_then_dead_rank_fails_the_others_clearly_within_the_timeout(tmp_path):
    results, codes, errs = launch("dying", tmp_path, env={"MCCL_TEST_TIMEOUT": "3"}, timeout=120)
    assert codes[1] == 3, errs[1][-2000:]
    assert 0 in results, f"rank 0 exited {codes[0]}:\n{errs[0][-3000:]}"
    for check in ("hung_peer", "dying_peer"):
        assert results[0][check]["ok"], results[0][check]["detail"]


@pytest.mark.parametrize("script", ["mydev", pytest.param("cuda", marks=pytest.mark.slow)])
def test_torchrun_ddp_with_default_backend(tmp_path, script):
    # "mydev": init_process_group() with no backend takes mccl. "cuda": a CUDA script under
    # transfer_to_mydev ("cuda" devices, init_process_group("nccl"), init_device_mesh("cuda")) runs unchanged.
    port = free_port()
    env = worker_env(MCCL_TEST_BACKEND="" if script == "mydev" else "nccl",
                     MCCL_TEST_CUDA_SCRIPT="1" if script == "cuda" else "0")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--master-addr",
         "127.0.0.1", "--master-port", str(port), WORKER, "torchrun", str(tmp_path)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for rank in range(WORLD):
        results = json.loads((tmp_path / f"torchrun-rank{rank}.json").read_text())
        assert results["_backend"]["detail"] == "mydev:mccl"
        for check in ("ddp", "fsdp2", "dtensor"):
            assert results[check]["ok"], f"rank {rank}: {check}:\n{results[check]['detail']}"


def test_freeing_a_storage_waits_for_the_kernels_queued_on_it():
    # FSDP2 frees unsharded parameters with untyped_storage().resize_(0) right after queuing the
    # kernels that read them; those kernels must still see the bytes (csrc/native/Resize.cpp).
    stream = torch.mydev.current_stream()
    x = torch.arange(64.0, device="mydev").reshape(8, 8)
    my_device._C._test_set_stream_delay(stream.stream_id, stream.device_index, 50_000)
    try:
        y = x @ x
        x.untyped_storage().resize_(0)
    finally:
        my_device._C._test_set_stream_delay(stream.stream_id, stream.device_index, 0)
    want = torch.arange(64.0).reshape(8, 8)
    assert torch.equal(y.cpu(), want @ want)
    assert x.untyped_storage().nbytes() == 0
