"""python -m my_device.conformance.fuzz: random programs through every frontend, and mutated program texts.

Programs (random_programs.py) chain OpInfo samples; each runs on the CPU, which gives the answer, and on mydev
through each frontend, forward and, where every op trains, backward:

    eager     the calls on mydev tensors
    compile   torch.compile(backend="mydev")
    inductor  torch.compile with Inductor (slow: code is generated and built per program)
    lazy      lazy tensors on mydev, one mark_step
    jit       torch.jit.trace, lowered with my_device.jit.to_mydev (forward only)

Then each program text the compile frontend built is mutated (program_text.py: a number, a dtype, a value, an
operator, an argument, a line) and compiled again: a mutant must be refused with a clear error, or run and agree
with the same text run op by op on the CPU. Workers run under MYDEV_STRICT=1, with a small device, each in its
own process: a crash is recorded against the program and frontend (or mutant) it happened in, and the run goes on.

    python -m my_device.conformance.fuzz --programs 200 --out /tmp/fuzz
    python -m my_device.conformance.fuzz --seed 17 --programs 1 --frontends lazy   # one program again
"""
import argparse
import json
import os
import pathlib
import random
import subprocess
import sys
import time

FRONTENDS = ("eager", "compile", "inductor", "lazy", "jit")
TRAINING_FRONTENDS = ("eager", "compile", "inductor", "lazy")
# Compilers may reorder floating-point work: a gradient summed over 256 terms of order 1 differed by 3.5e-5.
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
# A mutant is compared with its text run op by op, without a float64 run to tell how much it amplifies
# rounding (a digamma put in place of a neg, near a pole, amplified a reordered matrix product's by 1e3).
MUTANT_TOLERANCE = {"rtol": 1e-3, "atol": 1e-3}
# Outcomes that are findings, not passes.
FAILURES = ("wrong", "error", "crash", "unclear", "unchecked")
# Elements of storage beyond which a mutant's inputs are not made (it is counted as built, not run).
_LARGEST_INPUT = 1 << 24


def _through(frontend):
    import torch

    def compiled(program, backend):
        torch._dynamo.reset()

        def f(*xs):
            return program(*xs)

        return torch.compile(f, backend=backend, dynamic=False)

    if frontend == "eager":
        return lambda program: program
    if frontend in ("compile", "inductor"):
        return lambda program: compiled(program, "mydev" if frontend == "compile" else "inductor")
    if frontend == "lazy":
        import torch._lazy

        import my_device.lazy as ml

        ml.init()

        def lazy(program):
            def f(*xs):
                outs = program(*(x.to("lazy") for x in xs))
                torch._lazy.mark_step()
                return tuple(o.to("mydev") for o in outs)

            return f

        return lazy

    def jit(program):
        import my_device.jit as mj

        class Module(torch.nn.Module):
            def forward(self, *xs):
                return program(*xs)

        def f(*xs):
            try:
                # (traced on copies: tracing runs the program, which may write into its inputs)
                traced = torch.jit.trace(Module(), tuple(x.detach().clone() for x in xs), check_trace=False)
            except RuntimeError as e:  # the tracer's own refusals (an output that depends on no input)
                raise _Rejected("torch.jit.trace: " + str(e).splitlines()[0]) from None
            try:
                lowered = mj.to_mydev(traced, xs)
            except RuntimeError as e:
                raise _Rejected(str(e).splitlines()[0]) from None
            return lowered(*xs)

        return f

    return jit


class _Rejected(Exception):
    """A frontend refused the program with a clear error when building it."""


def _compare(got, want, precise=()):
    """got against the CPU's float32 results `want`; where a value differs beyond TOLERANCE, it may still differ
    by up to twice as much as `want` differs from the float64 results `precise` (a program that amplifies
    rounding, such as mvlgamma of a matrix product, amplifies a reordered sum's rounding as much)."""
    import torch

    if len(got) != len(want):
        raise AssertionError(f"{len(got)} results, the CPU gives {len(want)}")
    for k, (g, w) in enumerate(zip(got, want)):
        g = g.cpu()
        try:
            torch.testing.assert_close(g, w, equal_nan=True, check_stride=False, **TOLERANCE)
        except AssertionError:
            p = precise[k] if k < len(precise) else None
            if p is None or p.shape != w.shape or not w.is_floating_point() or g.dtype != w.dtype:
                raise
            slack = 2 * (w.double() - p.double()).abs()
            allowed = TOLERANCE["atol"] + TOLERANCE["rtol"] * w.double().abs() + slack
            if bool(((g.double() - w.double()).abs() > allowed).any()):
                raise


def _run_program(program, frontend):
    import torch

    from . import random_programs as rp

    cpu = lambda p: p  # noqa: E731
    trains = frontend in TRAINING_FRONTENDS
    try:
        want_out, want_grads, weights = rp.run(program, "cpu", cpu, trains)
    except RuntimeError:  # an op without a derivative: the program is compared forward only
        trains = False
        want_out, want_grads, weights = rp.run(program, "cpu", cpu, trains)
    try:
        precise_out, precise_grads, _ = rp.run(program, "cpu", cpu, trains, weights, dtype=torch.float64)
    except Exception:  # noqa: BLE001  (an op without float64: compared within TOLERANCE alone)
        precise_out, precise_grads = (), ()
    try:
        out, grads, _ = rp.run(program, "mydev", _through(frontend), trains, weights)
        _compare(out, want_out, precise_out)
        present = [k for k, g in enumerate(want_grads) if g is not None]
        _compare([grads[k] for k in present], [want_grads[k] for k in present],
                 [precise_grads[k] for k in present] if len(precise_grads) == len(want_grads) else ())
    except _Rejected as e:
        return "rejected", str(e)
    except AssertionError as e:
        return "wrong", str(e)[:600]
    except Exception as e:  # noqa: BLE001  (any other exception is the finding)
        text = str(e)
        return "error", f"{type(e).__name__}: {text[:300]} ... {text[-500:]}" if len(text) > 800 else text
    return "pass", ""


def _clear(e):
    """A refusal a user can act on: one of the errors an op raises, naming no C++ internals."""
    return isinstance(e, (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError)) and \
        "INTERNAL ASSERT" not in str(e) and str(e).strip() != ""


def _run_mutant(text, seed, compare=True):
    """The outcome of compiling and running `text` on inputs made from `seed`, and of comparing its outputs with
    the text run op by op on the CPU when `compare` (False where the unchanged text itself cannot be compared:
    random inputs a backward program reads as indices, such as embedding_bag's offset2bag, make its kernels
    read whatever memory they point at)."""
    import torch

    import my_device.compiler as mc

    from . import program_text as pt

    try:
        program = mc.compile(text)
    except Exception as e:  # noqa: BLE001
        return ("refused", "") if _clear(e) else ("unclear", f"compile: {type(e).__name__}: {str(e)[:300]}")
    try:
        geometries = pt.input_geometries(text)
    except ValueError as e:  # built, yet the text's inputs cannot be read back: the parser took something odd
        return "unchecked", f"built a program whose input lines do not parse: {e}"
    if any(g.storage_elements() > _LARGEST_INPUT for g in geometries):
        return "built", "inputs too large to make"
    gen = torch.Generator().manual_seed(seed)
    cpu = [g.tensor("cpu", gen) for g in geometries]
    dev = [t.to("mydev") if t.is_contiguous() and t.storage_offset() == 0 else _same_storage(t) for t in cpu]
    try:
        got = [t.cpu() for t in program.run(dev)]
        torch.mydev.synchronize()
    except Exception as e:  # noqa: BLE001
        if _clear(e) or _cpu_raises_alike(text, cpu, e):
            return "refused-at-run", ""
        return "unclear", f"run: {type(e).__name__}: {str(e)[:300]}"
    try:
        want = pt.run_reference(text, cpu)
    except Exception as e:  # noqa: BLE001
        return "unchecked", f"built and ran; op by op on the CPU: {type(e).__name__}: {str(e)[:300]}"
    if not compare:
        return "ran", ""
    try:
        pt.compare(got, want, **MUTANT_TOLERANCE)
    except AssertionError as e:
        return "wrong", str(e)[:600]
    return "ran", ""


def _cpu_raises_alike(text, cpu, error):
    """Whether the text run op by op on the CPU raises the same error: an ATen kernel's own internal assert on
    arguments it does not check (mse_loss's reduction, _fft_r2c's sizes) is what the CPU raises too."""
    from . import program_text as pt

    try:
        pt.run_reference(text, cpu)
    except Exception as e:  # noqa: BLE001
        first = lambda x: str(x).split("INTERNAL ASSERT")[0].split(": ")[-1].strip()  # noqa: E731
        return first(e) != "" and first(e) in str(error)
    return False


def _same_storage(t):
    """t's storage copied whole to mydev, and the same view of it."""
    import torch

    base = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (t.untyped_storage().nbytes() // t.element_size(),))
    return base.to("mydev").as_strided(t.shape, t.stride(), t.storage_offset())


def _recording_compile():
    """Records every program text the compiler builds (the compile frontend's lowered programs)."""
    from my_device import _C

    texts = []
    original = _C._compiler.compile

    def compile(text):
        texts.append(text)
        return original(text)

    _C._compiler.compile = compile
    return texts, lambda: setattr(_C._compiler, "compile", original)


def _worker(args):
    """Runs programs args.first.. and writes one JSON line per result, a 'start' line before each."""
    import torch

    import my_device  # noqa: F401

    from . import program_text as pt
    from . import random_programs as rp

    ops = rp.pool(args.ops.split(",") if args.ops else None)
    frontends = args.frontends.split(",")
    # What an earlier worker of this run finished, or crashed in (the parent recorded that), is not run again.
    done = {tuple(r["key"]) for r in _read(args.results) if "key" in r}
    with open(args.results, "a") as log:
        def write(record):
            log.write(json.dumps(record) + "\n")
            log.flush()

        for seed in range(args.first, args.seed + args.programs):
            program = rp.make(seed, ops, args.length)
            if not program.steps:
                continue
            for frontend in frontends:
                key = [seed, frontend]
                if tuple(key) in done:
                    continue
                write({"start": key, "program": program.describe()})
                texts, restore = _recording_compile() if frontend == "compile" else ([], lambda: None)
                try:
                    outcome, detail = _run_program(program, frontend)
                finally:
                    restore()
                write({"key": key, "outcome": outcome, "detail": detail})
                rng = random.Random(seed)
                for t, text in enumerate(texts):
                    inputs_seed = seed * 1000 + t
                    comparable = _run_mutant(text, inputs_seed)[0] == "ran"
                    for m in range(args.mutations):
                        mkey = [seed, f"mutant {t}.{m}"]
                        mutant = pt.mutate(text, rng)
                        if tuple(mkey) in done:
                            continue
                        write({"start": mkey, "program": mutant})
                        outcome, detail = _run_mutant(mutant, inputs_seed, comparable)
                        write({"key": mkey, "outcome": outcome, "detail": detail})
            torch._dynamo.reset()


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m my_device.conformance.fuzz", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--seed", type=int, default=0, help="the first program's seed (default: %(default)s)")
    p.add_argument("--programs", type=int, default=50, help="programs to make (default: %(default)s)")
    p.add_argument("--length", type=int, default=4, help="steps per program (default: %(default)s)")
    p.add_argument("--frontends", default="eager,compile,lazy,jit",
                   help=f"comma-separated, of {', '.join(FRONTENDS)} (default: %(default)s)")
    p.add_argument("--ops", help="comma-separated OpInfo names (default: every OpInfo with a float32 CPU kernel)")
    p.add_argument("--mutations", type=int, default=20, help="mutants of each program text compile built")
    p.add_argument("--out", default="fuzz-report", help="directory for report.json and report.md")
    p.add_argument("--timeout", type=float, default=900, help="seconds a worker may go without a result")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, help=argparse.SUPPRESS)
    p.add_argument("--results", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for f in args.frontends.split(","):
        if f not in FRONTENDS:
            p.error(f"frontend {f!r} is not one of {', '.join(FRONTENDS)}")
    return args


def _worker_command(args, first, results):
    cmd = [sys.executable, "-m", "my_device.conformance.fuzz", "--worker", "--seed", str(args.seed),
           "--programs", str(args.programs), "--first", str(first), "--length", str(args.length),
           "--frontends", args.frontends, "--mutations", str(args.mutations), "--results", results]
    if args.ops:
        cmd += ["--ops", args.ops]
    return cmd


def _read(results):
    records = []
    if os.path.exists(results):
        with open(results) as f:
            records = [json.loads(line) for line in f if line.strip()]
    return records


def run(args):
    """Runs workers until every program is done, a crashed one's program and frontend recorded as 'crash'."""
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = str(out / "results.jsonl")
    if os.path.exists(results):
        os.unlink(results)
    env = dict(os.environ, MYDEV_STRICT="1", MYDEV_MEMORY_LIMIT=os.environ.get("MYDEV_MEMORY_LIMIT", "2G"),
               MYDEV_FALLBACK="silent")
    started = time.monotonic()
    while True:
        records = _read(results)
        starts = [r for r in records if "start" in r]
        first = max([r["start"][0] for r in starts], default=args.seed)
        proc = subprocess.Popen(_worker_command(args, first, results), env=env)
        try:
            rc = proc.wait(timeout=args.timeout * max(1, args.programs))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "hung"
        if rc == 0:
            break
        records = _read(results)
        finished = {tuple(r["key"]) for r in records if "key" in r}
        last = next((r for r in reversed(records) if "start" in r), None)
        if last is None or tuple(last["start"]) in finished:
            raise SystemExit(f"a fuzz worker failed before running anything (exit {rc})")
        key = tuple(last["start"])
        with open(results, "a") as f:
            f.write(json.dumps({"key": list(key), "outcome": "crash", "detail": f"worker exit {rc}"}) + "\n")
    return _report(args, _read(results), time.monotonic() - started)


def _report(args, records, seconds):
    programs = {tuple(r["start"]): r["program"] for r in records if "start" in r}
    outcomes = {}
    findings = []
    for r in records:
        if "key" not in r:
            continue
        seed, where = r["key"]
        kind = "mutants" if where.startswith("mutant") else where
        outcomes.setdefault(kind, {}).setdefault(r["outcome"], 0)
        outcomes[kind][r["outcome"]] += 1
        if r["outcome"] in FAILURES:
            findings.append({"seed": seed, "where": where, "outcome": r["outcome"], "detail": r["detail"],
                             "program": programs.get((seed, where), "")})
    summary = {"command": "python -m my_device.conformance.fuzz " + " ".join(sys.argv[1:]),
               "seconds": round(seconds), "outcomes": outcomes, "findings": findings}
    out = pathlib.Path(args.out)
    (out / "report.json").write_text(json.dumps(summary, indent=1) + "\n")
    cols = ("pass", "rejected", "refused", "refused-at-run", "built", "ran", *FAILURES)
    lines = ["# Fuzz report", "", f"`{summary['command']}`: {round(seconds / 60, 1)} minutes", "",
             "| frontend | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for kind, counts in outcomes.items():
        lines.append(f"| {kind} | " + " | ".join(str(counts.get(c, 0)) for c in cols) + " |")
    for f in findings:
        lines += ["", f"## seed {f['seed']}, {f['where']}: {f['outcome']}", "", "```", f["program"], "```", "",
                  f["detail"]]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return summary


def main(argv=None):
    args = _parse(argv)
    if args.worker:
        _worker(args)
        return 0
    summary = run(args)
    for kind, counts in summary["outcomes"].items():
        print(f"{kind:10s} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"{len(summary['findings'])} findings; report in {args.out}/report.md")
    return 1 if summary["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
