"""all_reduce bus bandwidth on 2 processes: mydev tensors over mccl against CPU tensors over gloo.

Run: python bench/bench_distributed.py [--threads N] [--repeat R] [--mbytes M]
Both ranks join one process group "cpu:gloo,mydev:mccl", so the two backends are measured in the
same run, alternating. Each case is the median over R repetitions of a timed loop of all_reduce
(SUM, float32, M MiB, default 64) with the result waited for (mydev: torch.mydev.synchronize()).
Bus bandwidth = size * 2 (n - 1) / n / time, as nccl-tests report it. Target: mydev >= 0.8x gloo.
"""
import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist

WORLD = 2
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(mbytes, repeat, threads):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import my_device  # noqa: F401
    from common import median_seconds

    torch.set_num_threads(threads)
    rank = int(os.environ["RANK"])
    torch.mydev.set_device(rank)
    dist.init_process_group("cpu:gloo,mydev:mccl")
    numel = mbytes * (1 << 20) // 4
    cpu = torch.ones(numel)
    dev = torch.ones(numel, device="mydev")
    inner = 3
    results = {}
    for _ in range(2):  # alternate, twice, so neither side gets only the cold run; the second counts
        results["gloo (CPU tensors)"] = median_seconds(lambda: dist.all_reduce(cpu), inner, repeat)
        results["mccl (mydev tensors)"] = median_seconds(lambda: dist.all_reduce(dev), inner, repeat,
                                                         sync=torch.mydev.synchronize)
    size = numel * 4
    if rank == 0:
        print(f"all_reduce SUM float32 {mbytes} MiB, {WORLD} processes, median of {repeat} x {inner} calls")
        bus = {}
        for name, seconds in results.items():
            bus[name] = size * 2 * (WORLD - 1) / WORLD / seconds / 1e9
            print(f"  {name:22s} {seconds * 1e3:9.2f} ms   bus bandwidth {bus[name]:6.2f} GB/s")
        ratio = bus["mccl (mydev tensors)"] / bus["gloo (CPU tensors)"]
        print(f"  mydev/mccl vs CPU/gloo bus bandwidth: {ratio:.2f}x (target >= 0.8x)")
    dist.barrier()
    dist.destroy_process_group()


def main():
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process (default 1)")
    parser.add_argument("--repeat", type=int, default=5, help="timed repetitions per case")
    parser.add_argument("--mbytes", type=int, default=64, help="tensor size in MiB")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.mbytes, args.repeat, args.threads)
        return
    print(f"torch {torch.__version__}, {args.threads} intra-op thread(s) per process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", "--mbytes", str(args.mbytes), "--repeat",
             str(args.repeat), "--threads", str(args.threads)],
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])), RANK=str(r), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
        for r in range(WORLD)
    ]
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(f"ranks exited {codes}")


if __name__ == "__main__":
    main()
