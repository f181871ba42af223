"""The first call of random ops, nn.init functions and the demo's ops on mydev, each in a fresh process.

Run: python bench/bench_first_call.py [--device mydev|cpu]

Each case runs in a new interpreter that has already made one mydev tensor (so the device is
initialised), then times its first call (with a synchronisation) and says whether the call imported
torch._dynamo or sympy: a first call that plans a queued op with one of torch's Python Meta kernels
imports them, seconds on these machines. Target: every first call under 50 ms. Absolute times, one
process per case: compare with --device cpu on the same machine.
"""
import argparse
import subprocess
import sys

CASES = {
    "randn": "torch.randn(3, device=d)",
    "rand": "torch.rand(3, device=d)",
    "randint": "torch.randint(0, 5, (3,), device=d)",
    "randperm": "torch.randperm(5, device=d)",
    "multinomial": "torch.multinomial(torch.ones(4, device=d), 2)",
    "normal(tensor, float)": "torch.normal(torch.zeros(3, device=d), 1.0)",
    "bernoulli": "torch.bernoulli(torch.full((3,), 0.5, device=d))",
    "dropout": "torch.nn.functional.dropout(torch.ones(8, device=d), 0.5)",
    "exponential_": "torch.empty(3, device=d).exponential_()",
    "geometric_": "torch.empty(3, device=d).geometric_(0.5)",
    "cauchy_": "torch.empty(3, device=d).cauchy_()",
    "log_normal_": "torch.empty(3, device=d).log_normal_()",
    "random_": "torch.empty(3, device=d).random_(0, 9)",
    "init.normal_": "torch.nn.init.normal_(torch.empty(3, 3, device=d))",
    "init.uniform_": "torch.nn.init.uniform_(torch.empty(3, 3, device=d))",
    "init.kaiming_uniform_": "torch.nn.init.kaiming_uniform_(torch.empty(3, 3, device=d))",
    "init.xavier_normal_": "torch.nn.init.xavier_normal_(torch.empty(3, 3, device=d))",
    "init.trunc_normal_": "torch.nn.init.trunc_normal_(torch.empty(3, 3, device=d))",
    "init.orthogonal_": "torch.nn.init.orthogonal_(torch.empty(3, 3, device=d))",
    "init.sparse_": "torch.nn.init.sparse_(torch.empty(4, 4, device=d), 0.5)",
    "Linear": "torch.nn.Linear(4, 4, device=d)(torch.ones(2, 4, device=d))",
    "Conv2d": "torch.nn.Conv2d(3, 4, 3, device=d)(torch.ones(1, 3, 8, 8, device=d))",
    "cross_entropy": "torch.nn.functional.cross_entropy(torch.ones(2, 3, device=d), torch.tensor([0, 2], device=d))",
}

SCRIPT = """
import sys, time, torch
d = {device!r}
torch.ones(1, device=d).cpu()
start = time.perf_counter()
r = {expr}
(r[0] if isinstance(r, tuple) else r).cpu()
print(time.perf_counter() - start, "torch._dynamo" in sys.modules or "sympy" in sys.modules)
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="mydev")
    args = parser.parse_args()
    worst = 0.0
    for name, expr in CASES.items():
        out = subprocess.run([sys.executable, "-c", SCRIPT.format(device=args.device, expr=expr)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{name:24s} failed: {out.stderr.strip().splitlines()[-1]}")
            continue
        seconds, imported = out.stdout.split()
        worst = max(worst, float(seconds))
        print(f"{name:24s} {float(seconds) * 1e3:8.1f} ms{'   imported torch._dynamo/sympy' if imported == 'True' else ''}")
    print(f"slowest first call: {worst * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
