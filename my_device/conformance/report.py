"""The conformance report: figures, the op x dtype matrix, fallback use, and baseline comparison.

Input is the list of result records the pytest plugin writes (plus records of
batches that crashed); output is report.json and a Markdown page.
"""
import collections
import json
import os

FORWARD, BACKWARD = "test_forward", "test_backward"
PASSING = ("pass",)
# Not counted for or against an op: the test had nothing to check (the CPU
# rejects every sample), or the OpInfo itself limits it to another device.
# Manifest skips and expected failures count against it, like failures.
NOTHING_TO_CHECK = ("the CPU rejects every sample", "no sample", "the CPU accepts out= for no sample",
                    "Only runs on cuda", "Triton DSL not available")


# The ModuleInfo suite's tests with nothing to compare.
MODULE_NOTHING_TO_CHECK = NOTHING_TO_CHECK + ("no sample with a differentiable output",)


def _neutral(r):
    reasons = MODULE_NOTHING_TO_CHECK if r.get("suite") == "modules" else NOTHING_TO_CHECK
    return r["outcome"] == "skip" and any(r["message"].startswith(m) for m in reasons)


def _pct(n, d):
    return round(100.0 * n / d, 2) if d else None


def figures(results):
    """The headline numbers (see docs/conformance.md for their definitions)."""
    by = collections.defaultdict(list)
    for r in results:
        if r["op"] is not None and not _neutral(r):
            by[(r["test"], r["op"], r["dtype"])].append(r["outcome"])

    def share(test, dtype=None, per_op=False):
        # a crashed op (test "*", no dtype) fails every test and dtype
        keys = [k for k in by if k[0] in (test, "*") and (dtype is None or k[2] in (dtype, None))]
        if per_op:  # an op passes when every selected dtype passes
            ops = collections.defaultdict(list)
            for k in keys:
                ops[k[1]].extend(by[k])
            ok = sum(all(o in PASSING for o in v) for v in ops.values())
            return {"passing": ok, "total": len(ops), "percent": _pct(ok, len(ops))}
        ok = sum(all(o in PASSING for o in by[k]) for k in keys)
        return {"passing": ok, "total": len(keys), "percent": _pct(ok, len(keys))}

    fallback_ops = collections.Counter()
    for r in results:
        for name, calls in r.get("fallbacks", {}).items():
            fallback_ops[name] += calls
    outcomes = collections.Counter(r["outcome"] for r in results)
    return {
        "forward_float32_opinfos": share(FORWARD, "float32", per_op=True),
        "forward_all_dtypes_op_dtype_pairs": share(FORWARD),
        "forward_all_dtypes_opinfos": share(FORWARD, per_op=True),
        "backward_op_dtype_pairs": share(BACKWARD),
        "backward_opinfos": share(BACKWARD, per_op=True),
        "all_tests_op_test_dtype": {"passing": outcomes["pass"], "total": sum(outcomes.values()),
                                    "percent": _pct(outcomes["pass"], sum(outcomes.values()))},
        "outcomes": dict(outcomes),
        "fallback_ops": dict(fallback_ops),
    }


def module_figures(results):
    """The ModuleInfo suite's numbers: the share of modules passing every test the CPU can check,
    per dtype and over both."""
    by = collections.defaultdict(list)
    for r in results:
        if r["op"] is not None and not _neutral(r):
            by[(r["op"], r["dtype"])].append(r["outcome"])

    def share(dtype=None):
        modules = collections.defaultdict(list)
        for (module, dt), outcomes in by.items():
            if dtype is None or dt in (dtype, None):
                modules[module].extend(outcomes)
        ok = sum(all(o in PASSING for o in v) for v in modules.values())
        return {"passing": ok, "total": len(modules), "percent": _pct(ok, len(modules))}

    fallback_ops = collections.Counter()
    for r in results:
        for name, calls in r.get("fallbacks", {}).items():
            fallback_ops[name] += calls
    outcomes = collections.Counter(r["outcome"] for r in results)
    return {
        "modules_passing_every_test_float32": share("float32"),
        "modules_passing_every_test_float64": share("float64"),
        "modules_passing_every_test_all_dtypes": share(),
        "all_tests_module_test_dtype": {"passing": outcomes["pass"], "total": sum(outcomes.values()),
                                        "percent": _pct(outcomes["pass"], sum(outcomes.values()))},
        "outcomes": dict(outcomes),
        "fallback_ops": dict(fallback_ops),
    }


def compare(results, baseline):
    """(regressions, improvements): (test, op, dtype, old, new) that left or reached 'pass'. A test
    that fails or crashes where it was skipped or expected to fail regresses too: a manifest
    entry that stopped applying is no smaller a change than a pass that stopped passing.

    Only tests run in both reports are compared (a narrower run is no
    regression), except that an op that crashed regresses every test it passed."""
    def index(rs):
        return {(r["test"], r["op"], r["dtype"]): r["outcome"] for r in rs if r["op"] is not None}

    old, new = index(baseline), index(results)
    crashed = {r["op"] for r in results if r["outcome"] == "crash"}
    regressions = [(*k, old[k], "crash" if k[1] in crashed else new[k]) for k in sorted(old, key=str)
                   if (old[k] == "pass" and (k[1] in crashed or new.get(k, "pass") != "pass"))
                   or (old[k] != new.get(k, old[k]) and new.get(k) in ("fail", "crash"))]
    improvements = [(*k, old[k], new[k]) for k in sorted(new, key=str)
                    if new[k] == "pass" and old.get(k, "pass") != "pass"]
    return regressions, improvements


_MARK = {"pass": "✓", "fail": "✗", "xfail": "xf", "xpass": "XP", "skip": "s", "crash": "💥"}


def markdown(meta, results, figs, regressions=None, improvements=None, manifest_lookup=None, suite="ops"):
    what = "module" if suite == "modules" else "op"
    lines = [f"# mydev {'ModuleInfo' if suite == 'modules' else 'OpInfo'} conformance", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += ["", "## Figures", "", "| measure | passing | total | % |", "|---|---:|---:|---:|"]
    for name, f in figs.items():
        if isinstance(f, dict) and "passing" in f:
            lines.append(f"| {name.replace('_', ' ')} | {f['passing']} | {f['total']} | {f['percent']} |")
    lines += ["", "Outcomes of all tests: " + ", ".join(f"{k} {v}" for k, v in sorted(figs["outcomes"].items())), ""]
    lines += ["## Ops served by the copying CPU fallback", ""]
    if figs["fallback_ops"]:
        lines += ["| op | calls |", "|---|---:|"]
        lines += [f"| `{k}` | {v} |" for k, v in sorted(figs["fallback_ops"].items(), key=lambda kv: -kv[1])]
    else:
        lines.append("None: no test used the copying fallback.")
    if regressions is not None:
        lines += ["", f"## Against the baseline: {len(regressions)} regressions, {len(improvements)} improvements", ""]
        for title, rows in (("Regressions", regressions), ("Improvements", improvements)):
            lines += [f"### {title}", ""] + ([f"- {t} `{o}` {d}: {a} -> {b}" for t, o, d, a, b in rows] or ["none"])
            lines.append("")

    # op x dtype matrix: one cell per (op, dtype), the worst outcome of its tests
    tests = sorted({r["test"] for r in results if r["op"]})
    dtypes = sorted({r["dtype"] for r in results if r["op"] and r["dtype"]})
    cells = collections.defaultdict(dict)
    problems = []
    for r in results:
        if r["op"] is None:
            continue
        cells[(r["op"], r["dtype"])][r["test"]] = r
        if r["outcome"] not in ("pass",) and not _neutral(r):
            problems.append(r)
    order = ("crash", "fail", "xpass", "xfail", "skip", "pass")

    def cell(op, dtype):
        rs = cells.get((op, dtype))
        if not rs:
            return ""
        worst = min((r["outcome"] for r in rs.values() if not _neutral(r)), key=order.index, default="pass")
        bad = [t.removeprefix("test_") for t, r in rs.items() if r["outcome"] == worst and worst != "pass"]
        return _MARK[worst] + (f" {','.join(sorted(bad))}" if bad else "")

    lines += ["", f"## {what.capitalize()} x dtype", "",
              f"Each cell is the worst outcome over the tests ({', '.join(t.removeprefix('test_') for t in tests)}) "
              f"and names the tests that had it. {', '.join(f'{v} {k}' for k, v in _MARK.items())}; "
              "empty: not run (CPU lacks the dtype, or outside the selection).", "",
              f"| {what} | " + " | ".join(dtypes) + " |", "|---|" + "---|" * len(dtypes)]
    for op in sorted({r["op"] for r in results if r["op"]}):
        lines.append(f"| {op} | " + " | ".join(cell(op, d) for d in dtypes) + " |")
    lines += ["", "## Everything that did not pass, with its reason", "",
              f"| {what} | dtype | test | outcome | reason |", "|---|---|---|---|---|"]
    for r in sorted(problems, key=lambda r: (r["op"], r["dtype"] or "", r["test"])):
        reason = r["message"].split("\n")[0]
        if manifest_lookup and r["outcome"] in ("xfail", "skip", "xpass"):
            entry = manifest_lookup(r["op"], r["test"], r["dtype"])
            reason = entry.reason if entry else reason
        reason = reason.replace("|", "\\|")[:300]
        lines.append(f"| {r['op']} | {r['dtype']} | {r['test'].removeprefix('test_')} | {r['outcome']} | {reason} |")
    return "\n".join(lines) + "\n"


def write(path_json, path_md, meta, results, baseline_path=None, manifest_lookup=None, suite="ops"):
    if suite == "modules":
        for r in results:
            r["suite"] = "modules"
    figs = module_figures(results) if suite == "modules" else figures(results)
    regressions = improvements = None
    if baseline_path:
        with open(baseline_path) as f:
            regressions, improvements = compare(results, json.load(f)["results"])
    with open(path_json, "w") as f:
        # one result per line, so that two reports diff line by line
        head = json.dumps({"meta": meta, "figures": figs}, indent=1, sort_keys=True)
        rows = ",\n".join(json.dumps({k: v for k, v in r.items() if k != "nodeid"}, sort_keys=True)
                          for r in sorted(results, key=lambda r: (r["op"] or "", r["test"], r["dtype"] or "")))
        f.write(head[:-2] + ',\n "results": [\n' + rows + "\n]}\n")
    with open(path_md, "w") as f:
        f.write(markdown(meta, results, figs, regressions, improvements, manifest_lookup, suite))
    return figs, regressions, improvements


def print_baseline_outcome(baseline, regressions, improvements, out):
    """Prints the comparison with --baseline (if given) and the report's path; the exit code: 1 on regressions."""
    if regressions is not None:
        print(f"against {baseline}: {len(regressions)} regressions, {len(improvements)} improvements")
        for r in regressions:
            print("  regression:", *r)
    print(f"report: {os.path.join(out, 'report.md')}")
    return 1 if regressions else 0
