"""python -m my_device.conformance: the full OpInfo sweep, crash-isolated, with a report.

Runs the conformance test module (test/test_conformance.py by default) under
pytest in batches of OpInfos, each batch in its own process, so a crash loses
one batch: the OpInfos of a crashed batch that reported nothing are rerun one
by one, and one that still crashes is recorded as "crash". Writes report.json
and report.md to --out. Examples:

    python -m my_device.conformance                              # everything
    python -m my_device.conformance --dtypes float32 --out /tmp/c
    python -m my_device.conformance --ops add,nn.functional.relu --baseline docs/conformance.json
    python -m my_device.conformance --module path/to/vendor_test.py
    python -m my_device.conformance --suite modules --out /tmp/m    # the ModuleInfo suite (module_db)
    python -m my_device.conformance --suite modules --modules nn.LSTM,nn.GRU

--suite pytorch runs PyTorch's own device-generic test files on the CPU and on
mydev and compares them (see pytorch_suite.py and docs/pytorch-tests-howto.md):

    python -m my_device.conformance --suite pytorch --pytorch-tests ~/pytorch/test
    python -m my_device.conformance --suite pytorch --pytorch-tests ~/pytorch/test --files nn/test_dropout.py
"""
import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from . import frontends, manifest, pytorch_suite, report, selection
from .plugin import RESULTS_VAR

_TESTS = pathlib.Path(__file__).resolve().parents[2] / "test"
DEFAULT_MODULE = {"ops": _TESTS / "test_conformance.py", "modules": _TESTS / "test_modules.py"}


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m my_device.conformance", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=("ops", "modules", "pytorch"), default="ops",
                   help="ops: OpInfos (op_db); modules: ModuleInfos (module_db); pytorch: PyTorch's own "
                   "device-generic test files, on the CPU and on mydev (default: %(default)s)")
    p.add_argument("--pytorch-tests", metavar="DIR",
                   help="--suite pytorch: the test/ folder of a PyTorch source checkout of the installed version")
    p.add_argument("--files", help="--suite pytorch: comma-separated files under DIR, e.g. "
                   "test_view_ops.py,nn/test_dropout.py (default: the eleven of pytorch_suite.DEFAULT_FILES)")
    p.add_argument("--ops", help="comma-separated OpInfo names or full names (default: all of op_db)")
    p.add_argument("--modules", help="--suite modules: comma-separated module names, e.g. nn.LSTM (default: all)")
    p.add_argument("--dtypes", help="comma-separated dtypes, e.g. float32,int64 (default: all the CPU supports); "
                   "with --suite pytorch: only the tests instantiated for them ('none': those without a dtype)")
    p.add_argument("--tests", help="comma-separated test names, e.g. test_forward,test_backward (default: all, "
                   "or test_forward,test_backward with a --frontend other than eager)")
    p.add_argument("--frontend", default="eager", choices=frontends.FRONTENDS,
                   help="what mydev's side of each sample runs through: eager (default), compile "
                        "(torch.compile(backend='mydev')), inductor (torch.compile with Inductor) or lazy (lazy "
                        "tensors on mydev; --suite ops only); compared with CPU eager")
    p.add_argument("--module", help="the pytest module to run (default: test/test_conformance.py, or "
                   "test/test_modules.py for --suite modules)")
    p.add_argument("--out", help="directory for report.json and report.md (default: conformance-report, or "
                   "pytorch-tests-report for --suite pytorch)")
    p.add_argument("--baseline", help="an earlier report.json: list regressions and improvements against it")
    p.add_argument("--batch-size", type=int, help="OpInfos or modules per process (default: 25), or tests per "
                   "process for --suite pytorch (default: 500)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a batch counts as hung")
    p.add_argument("--seed-tries", type=int, default=30, help="--suite pytorch: seeds under which the CPU reruns a "
                   "test mydev fails with a numeric mismatch, to tell a tolerance the CPU misses on other data too")
    args = p.parse_args(argv)
    pytorch = args.suite == "pytorch"
    args.out = args.out or ("pytorch-tests-report" if pytorch else "conformance-report")
    args.batch_size = args.batch_size or (500 if pytorch else 25)
    if not pytorch:
        args.module = args.module or str(DEFAULT_MODULE[args.suite])
    return args


def _select_ops(spec):
    from torch.testing._internal.common_methods_invocations import op_db

    names = [op.full_name for op in op_db]
    if not spec:
        return names
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    chosen = [op.full_name for op in op_db if op.full_name in wanted or op.name in wanted]
    unknown = [w for w in wanted if w not in names and not any(op.name == w for op in op_db)]
    if unknown:
        sys.exit(f"no OpInfo named {unknown}")
    return chosen


def _select_modules(spec):
    from torch.testing._internal.common_modules import module_db

    names = [m.name for m in module_db]
    if not spec:
        return names
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [w for w in wanted if w not in names]
    if unknown:
        sys.exit(f"no ModuleInfo named {unknown}")
    return [n for n in names if n in wanted]


def _run_batch(args, ops, results_path):
    env = dict(os.environ)
    names_var = selection.MODULES_VAR if args.suite == "modules" else selection.OPS_VAR
    env.update({selection.MODE_VAR: "full", names_var: ",".join(ops), RESULTS_VAR: results_path,
                "MYDEV_FALLBACK": "silent", "PYTORCH_PRINT_REPRO_ON_FAILURE": "0"})
    if args.dtypes:
        env[selection.DTYPES_VAR] = args.dtypes
    env[selection.FRONTEND_VAR] = args.frontend
    cmd = [sys.executable, "-m", "pytest", args.module, "-q", "-p", "my_device.conformance.plugin",
           "-p", "no:cacheprovider", "--tb=no", "--no-header", "-rN"]
    if args.tests:
        cmd += ["-k", " or ".join(t.strip() for t in args.tests.split(","))]
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=args.timeout)
        return proc.returncode, proc.stdout[-2000:]
    except subprocess.TimeoutExpired:
        return "timeout", ""


def _read(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None):
    args = _parse(argv)
    if args.suite == "pytorch":
        return pytorch_suite.main(args, argv)
    if args.frontend != "eager":
        if args.suite == "modules" and args.frontend not in frontends.MODULE_FRONTENDS:
            raise SystemExit(f"--suite modules --frontend: one of {', '.join(frontends.MODULE_FRONTENDS)}")
        args.tests = args.tests or "test_forward,test_backward"
    ops = _select_modules(args.modules) if args.suite == "modules" else _select_ops(args.ops)
    unit = "modules" if args.suite == "modules" else "OpInfos"
    batches = [ops[i:i + args.batch_size] for i in range(0, len(ops), args.batch_size)]
    os.makedirs(args.out, exist_ok=True)
    results, crashed = [], []
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for n, batch in enumerate(batches, 1):
            path = os.path.join(tmp, f"batch{n}.jsonl")
            code, tail = _run_batch(args, batch, path)
            got = _read(path)
            if code not in (0, 1, 5):  # 5: nothing collected (e.g. --tests matched none)
                # The process died: each OpInfo that has not reported every test another one did is rerun on
                # its own (one that crashed after its backward test had lost its forward test's outcome).
                tests = {t.strip() for t in args.tests.split(",")} if args.tests else {r["test"] for r in got}
                complete = {op for op in batch if {r["test"] for r in got if r["op"] == op} >= tests}
                got = [r for r in got if r["op"] in complete]
                for op in (o for o in batch if o not in complete):
                    single = os.path.join(tmp, f"batch{n}-{len(crashed)}-{op}.jsonl")
                    code1, tail1 = _run_batch(args, [op], single)
                    got_single = _read(single)
                    got += got_single
                    if code1 not in (0, 1, 5) and not got_single:
                        crashed.append(op)
                        got.append({"nodeid": None, "test": "*", "op": op, "dtype": None, "outcome": "crash",
                                    "message": f"pytest exited with {code1}: {tail1.strip()[-300:]}",
                                    "seconds": None, "fallbacks": {}})
            results += got
            elapsed = time.monotonic() - start
            eta = elapsed / n * (len(batches) - n)
            fails = sum(r["outcome"] in ("fail", "crash", "xpass") for r in results)
            print(f"[{n}/{len(batches)}] {sum(len(b) for b in batches[:n])}/{len(ops)} {unit}, "
                  f"{len(results)} tests, {fails} failing, {elapsed / 60:.1f} min elapsed, "
                  f"ETA {eta / 60:.1f} min", flush=True)
    import torch

    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__, "command": "python -m my_device.conformance " + " ".join(argv or sys.argv[1:]),
            "module": os.path.relpath(args.module) if args.module.startswith(os.getcwd()) else args.module,
            unit.lower(): len(ops), "dtypes": args.dtypes or ("float32, float64" if args.suite == "modules" else
                                                              "all the CPU supports"),
            "tests": args.tests or "all", "frontend": args.frontend,
            "minutes": round((time.monotonic() - start) / 60, 1), "crashed": crashed}
    figs, regressions, improvements = report.write(
        os.path.join(args.out, "report.json"), os.path.join(args.out, "report.md"), meta, results,
        args.baseline, lambda op, test, dtype: (manifest.module_lookup if args.suite == "modules" else manifest.lookup)(
            op, test, selection.dtype_from_name(dtype) if dtype else None), suite=args.suite)
    for name, f in figs.items():
        if isinstance(f, dict) and "passing" in f:
            print(f"{name}: {f['passing']}/{f['total']} ({f['percent']}%)")
    print(f"ops served by the copying fallback: {figs['fallback_ops'] or 'none'}")
    return report.print_baseline_outcome(args.baseline, regressions, improvements, args.out)


if __name__ == "__main__":
    sys.exit(main())
