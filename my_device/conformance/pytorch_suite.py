"""--suite pytorch: PyTorch's own device-generic test files, run on the CPU and on mydev, compared.

    python -m my_device.conformance --suite pytorch --pytorch-tests ~/pytorch/test
    python -m my_device.conformance --suite pytorch --pytorch-tests ~/pytorch/test \\
        --files test_view_ops.py,nn/test_dropout.py --out /tmp/pt --baseline old/report.json

--pytorch-tests is the test/ folder of a PyTorch source checkout of the installed
torch's version (the project ships none of PyTorch's files; see
docs/pytorch-tests-howto.md). Each file is run with that folder as the working
directory, since its tests import helper modules that sit beside them.

A file's classes made by instantiate_device_type_tests come out once per device
type: TestFooCPU, and for the PrivateUse1 backend TestFooPRIVATEUSE1 or
TestFooMYDEV (the first class a process instantiates is named before the base
class learns the backend's name, later ones after), with tests test_bar_cpu_float32
and test_bar_mydev_float32. Per file the harness:
1. collects the file twice, under PYTORCH_TESTING_DEVICE_ONLY_FOR=cpu and =mydev,
   which limit instantiation to that device type. A class collected under both is
   not device-generic and is left out (it runs the same CPU code in both runs);
   CLASS_FILTER narrows a file to some generic classes;
2. runs each device's tests in batches of --batch-size, each batch a pytest
   process of its own (-p no:cacheprovider, no -x) with --timeout. When a batch
   dies (signal, abort, timeout) before reporting all its tests, the first
   unreported test, the one that was running, is rerun alone (with at most
   SINGLE_TIMEOUT seconds), and recorded as "crash" if it dies again; the
   tests after it go back into the queue;
3. pairs the CPU and mydev results by test id, the node id with the device suffix
   taken off the class and the test name (file::TestFoo::test_bar_float32), and
   writes report.json and report.md to --out.

What the report counts, per file and in total:
- "mydev passes / CPU passes": of the tests the CPU passes, the share mydev passes;
- tests that cannot pass on a PrivateUse1 device, each with its reason, listed apart
  and left out of "excluding impossible": tests PyTorch never instantiates for
  mydev (an only_for/except_for class, device-specific dtypes), tests PyTorch
  skips for every PrivateUse1 backend (IMPOSSIBLE_SKIPS: @onlyCPU,
  @onlyNativeDeviceTypes, @skipPRIVATEUSE1), and tests that check a CPU-only
  answer (IMPOSSIBLE_FAILURES, e.g. the convolution backend a CPU tensor selects);
- failures the CPU shares on other data: a mydev failure that is a numeric
  mismatch is rerun on the CPU with the framework's seed set to 1, 2, ...
  --seed-tries; a test the CPU then fails too is listed apart with that seed and
  left out of "excluding impossible" (mydev's generator draws other numbers than
  the CPU's, as CUDA's does, so such a test's tolerance is tried on other data);
- mydev-only failures (the CPU passes, mydev fails, crashes or xfails), grouped by
  the first line of the error with addresses and numbers normalised, and
  mydev-only skips grouped by reason.

The harness never modifies the test files. Copies of PyTorch's tests newer than
the installed torch may fail to import; a file that does not collect is reported
with its import error, and the user may need to patch its import lines, e.g. a
decorator that moved (`skip`/`skipOps` now imported from common_device_type) or
was renamed (`skipIfMps` is `skipIfMPS` in older versions).
"""
import collections
import datetime
import fnmatch
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time

from . import plugin, report

DEVICE = "mydev"

DEFAULT_FILES = (
    "test_view_ops.py", "test_ops.py", "test_torch.py", "test_indexing.py", "test_reductions.py",
    "test_binary_ufuncs.py", "test_unary_ufuncs.py", "nn/test_pooling.py", "nn/test_embedding.py",
    "nn/test_convolution.py", "nn/test_dropout.py",
)

# Per file, the generic (device-suffix-free) classes to run; a file not listed
# runs all its device-generic classes. test_ops.py's other classes (fake tensors,
# math bits, composite compliance, ...) add tens of thousands of tests that say
# little about a backend's kernels; TestCommon runs every op in every dtype.
CLASS_FILTER = {
    "test_ops.py": ("TestCommon",),
}

# mydev skip messages of tests that PyTorch will not run on any PrivateUse1
# backend: (regular expression, reason).
IMPOSSIBLE_SKIPS = (
    (r"^Only runs on \[?'?cpu'?\]?$", "@onlyCPU: runs on the CPU only"),
    (r"^Only runs on ", "@onlyOn: limited to device types that do not include the PrivateUse1 backend"),
    # torch 2.13 counts the PrivateUse1 backend among its native device types; older ones did not
    (r"^onlyNativeDeviceTypes", "@onlyNativeDeviceTypes: runs on PyTorch's in-tree device types only"),
    (r"^test doesn't work on privateuse1 backend", "@skipPRIVATEUSE1: PyTorch skips it on every PrivateUse1 backend"),
)

# mydev failures of tests that check an answer only the CPU (or CUDA) can give:
# (file glob, test-id regular expression, message regular expression or None, reason).
IMPOSSIBLE_FAILURES = (
    ("nn/test_convolution.py", r"::test_conv_backend", r"ConvBackend",
     "compares torch._C._select_conv_backend with a CPU/CUDA backend (Slow2d, Mkldnn, ...); a "
     "PrivateUse1 tensor selects ConvBackend.Overrideable"),
    ("*", r"", r"ConvBackend\.Overrideable",
     "expects a CPU/CUDA convolution backend; a PrivateUse1 tensor selects ConvBackend.Overrideable"),
    ("test_torch.py", r"::test_tensor_storage_type_", r"<class 'torch\.\w+Storage'>",
     "expects torch.<Name>Storage, the CPU's class, for every device but CUDA; PyTorch looks a PrivateUse1 "
     "storage's class up in the backend's module (torch.mydev.FloatStorage, as torch.cuda.FloatStorage)"),
    ("test_torch.py", r"::test_broadcast_fn_map2?$", r"map2?_ is only implemented on CPU tensors",
     "Tensor.map_/map2_ are CPU-only in PyTorch; the test skips them on CUDA only"),
    ("test_binary_ufuncs.py", r"::test_fmod_remainder_by_zero_integral_", r"ZeroDivisionError",
     "expects CUDA's undefined results of integer fmod/remainder by zero on any device but the CPU; mydev runs "
     "the CPU's kernels, which raise ZeroDivisionError as the test expects of the CPU"),
    ("test_ops.py", r"::test_python_ref_errors__refs_where$", r"is not on the expected device cpu",
     "expects the eager op's device message from the prims reference, which gives its own for any device but "
     "the CPU; PyTorch marks it an expected failure on CUDA and MPS"),
    ("test_binary_ufuncs.py", r"::test_type_promotion__refs_copysign$", r"Expected divisor \(b\) to be on the same",
     "the reference refuses a 0-dim CPU tensor beside a tensor of any other device (PyTorch skips the test with "
     "this message for CUDA)"),
    ("test_binary_ufuncs.py", r"::test_(complex_scalar_pow_tensor|pow)_float16$", r"not implemented for 'ComplexHalf'",
     "expects pow of complex32 on every device but the CPU, while test_ops.py's test_dtypes holds a PrivateUse1 "
     "device to the CPU's dtypes for pow, which leave complex32 out; mydev keeps the CPU's"),
)

# Errors that only wrap the one they were raised from: a failure with one of these
# first lines is grouped by the error it wraps (the plugin records it as "cause").
WRAPPERS = (r"^RuntimeError: Comparing$",)

ABSENT_CLASS = "the class is instantiated for the CPU only (only_for/except_for)"
ABSENT_TEST = "not instantiated for mydev (device-specific dtypes or parameters)"

# A mydev failure with one of these messages is a value that differs, which other
# random data may give on the CPU too: the harness reruns it there under other seeds.
MISMATCH = r"not close|not equal|Mismatched elements"

# a lone test gets at most this long, however long --timeout gives a batch
SINGLE_TIMEOUT = 600
OK_EXITS = (0, 1, 5)  # all passed, some failed, nothing selected
FAILING = ("fail", "crash", "xpass", "error")


# --- names

def _suffixes(device):
    return ("CPU",) if device == "cpu" else (device.upper(), "PRIVATEUSE1")


def split_nodeid(nodeid):
    """(file, class, test) of a node id file::Class::test (class None for a module-level test)."""
    parts = nodeid.split("::")
    return parts[0], (parts[1] if len(parts) > 2 else None), parts[-1]


def generic_class(cls, device):
    for s in _suffixes(device):
        if cls and cls.endswith(s) and len(cls) > len(s):
            return cls[:-len(s)]
    return cls


def generic_test(name, device):
    """The test name without its device part: test_foo_cpu_float32 -> test_foo_float32.

    The device comes after the test's own name and parameters and before the dtypes,
    none of which contain it, so the last occurrence is the one."""
    hits = list(re.finditer(r"_%s(?=_|$|\[)" % re.escape(device), name))
    if not hits:
        return name
    m = hits[-1]
    return name[:m.start()] + name[m.end():]


def test_id(nodeid, device):
    f, cls, name = split_nodeid(nodeid)
    return "::".join(p for p in (f, generic_class(cls, device), generic_test(name, device)) if p)


_HEX = re.compile(r"0x[0-9a-fA-F]+")
_NUM = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w])")
_SCALAR = r"(?:Half|BFloat16|Float|Double|Long|Int|Short|Char|Byte|Bool|ComplexHalf|ComplexFloat|ComplexDouble)"
_DTYPES = (
    # torch.HalfTensor, torch.sparse.HalfTensor, CPUBFloat16Type, SparseCPUFloatType
    (re.compile(r"\b(torch\.(?:sparse\.)?|(?:Sparse)?(?:CPU|CUDA)?)%s(Tensor|Type)\b" % _SCALAR), r"\1<dtype>\2"),
    (re.compile(r"'%s'" % _SCALAR), "'<dtype>'"),  # "not implemented for 'Half'"
    (re.compile(r"\btorch\.(?:u?int\d+|float\d+|bfloat16|complex\d+|half|bool)\b"), "torch.<dtype>"),
)


def normalise(message):
    """The group key of an error: its first line, with addresses, numbers and dtype names
    replaced, so that one cause in many shapes, dtypes or pointer values makes one group."""
    line = next((ln.strip() for ln in (message or "").splitlines() if ln.strip()), "(no message)")
    line = _NUM.sub("N", _HEX.sub("0x…", line))
    for pattern, repl in _DTYPES:
        line = pattern.sub(repl, line)
    return re.sub(r"\s+", " ", line)[:240]


# --- running

def _env(device, **extra):
    env = dict(os.environ)
    env.pop("PYTORCH_TESTING_DEVICE_EXCEPT_FOR", None)
    env.update({"PYTORCH_TESTING_DEVICE_ONLY_FOR": device, plugin.NAMES_VAR: "raw",
                "MYDEV_FALLBACK": "silent", "PYTORCH_PRINT_REPRO_ON_FAILURE": "0"})
    env.update(extra)
    return env


def _no_core_files():
    # A crashing test's core file (a torch process: hundreds of MB) is nothing the report uses, and
    # writing it loads the machine for seconds after its batch has ended.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _pytest(args, cwd, env, timeout):
    """(exit code or "timeout", output). The process gets a session of its own, so a timeout
    kills whatever it started too."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "my_device.conformance.plugin", "-p", "no:cacheprovider",
           "--rootdir", cwd, "--no-header", "-rN", *args]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True, preexec_fn=_no_core_files)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        return "timeout", out


def _error_line(output):
    """The line of a pytest output that names why collection or a process failed."""
    lines = output.splitlines()
    for pat in (r"^E\s+\w*(Error|Exception)\b", r"Fatal Python error", r"^\w*(Error|Exception):", r"terminate called",
                r"Segmentation fault|Aborted|core dumped"):
        hits = [ln for ln in lines if re.search(pat, ln)]
        if hits:
            return re.sub(r"^E\s+", "", hits[0].strip())[:400]
    return (lines[-1].strip() if lines else "")[:400]


def _describe_exit(code, output):
    if code == "timeout":
        what = "timed out"
    elif isinstance(code, int) and code < 0:
        try:
            what = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            what = f"killed by signal {-code}"
    else:
        what = f"pytest exited with {code}"
    line = _error_line(output)
    return f"{what}: {line}" if line else what


def collect(tests_dir, rel_file, device, tmp, timeout):
    """(node ids, error message or None) of the file's tests under one device type."""
    path = os.path.join(tmp, f"collected-{device}.txt")
    if os.path.exists(path):
        os.remove(path)
    code, out = _pytest(["--collect-only", "--tb=short", rel_file], tests_dir,
                        _env(device, **{plugin.COLLECTED_VAR: path}), timeout)
    ids = []
    if os.path.exists(path):
        with open(path) as f:
            ids = [ln.strip() for ln in f if ln.strip()]
    error = None
    if code not in (0, 5) or "ERROR collecting" in out or "errors during collection" in out:
        error = _describe_exit(code, out)
    return ids, error


def _read(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_isolated(tests_dir, device, nodeids, batch_size, timeout, tmp, progress=None, env=None):
    """{node id: result record} for the given tests of one device type, crash-isolated; env: more
    environment variables for its processes."""
    results, queue, n = {}, list(nodeids), 0

    def batch_run(ids, limit):
        nonlocal n
        n += 1
        tag = f"{device}-{n}-{len(results)}-{id(ids)}"
        sel, res = os.path.join(tmp, f"sel-{tag}.txt"), os.path.join(tmp, f"res-{tag}.jsonl")
        with open(sel, "w") as f:
            f.writelines(i + "\n" for i in ids)
        # naming the classes, not the file, spares collecting the classes of the other device
        targets = sorted({"::".join(split_nodeid(i)[:2]) if split_nodeid(i)[1] else split_nodeid(i)[0] for i in ids})
        code, out = _pytest(["--tb=no", *targets], tests_dir,
                            _env(device, **{plugin.RESULTS_VAR: res, plugin.SELECT_VAR: sel}, **(env or {})), limit)
        wanted = set(ids)
        got = {r["nodeid"]: r for r in _read(res) if r["nodeid"] in wanted}
        return got, code, out

    while queue:
        batch, queue = queue[:batch_size], queue[batch_size:]
        got, code, out = batch_run(batch, timeout)
        results.update(got)
        missing = [i for i in batch if i not in got]
        if missing and code in OK_EXITS:
            for i in missing:  # e.g. an error in a fixture or teardown before the test was reported
                results[i] = _record(i, "error", "no result reported: " + _describe_exit(code, out))
        elif missing:
            suspect, rest = missing[0], missing[1:]
            got1, code1, out1 = batch_run([suspect], min(timeout, SINGLE_TIMEOUT))
            results.update(got1)
            if suspect not in got1:
                results[suspect] = _record(suspect, "crash", _describe_exit(code1, out1))
            queue = rest + queue
        if progress:
            progress(len(results), len(nodeids))
    return results


def _record(nodeid, outcome, message):
    return {"nodeid": nodeid, "test": split_nodeid(nodeid)[2], "op": None, "dtype": None, "outcome": outcome,
            "message": message, "seconds": None, "fallbacks": {}}


def select(cpu_ids, dev_ids, rel_file):
    """The node ids each device runs, and the number of tests of classes that are not
    device-generic. Classes collected under both device types do not depend on the device."""
    def classes(ids):
        return {split_nodeid(i)[1] for i in ids}

    shared = classes(cpu_ids) & classes(dev_ids)
    wanted = CLASS_FILTER.get(rel_file)

    def keep(i, device):
        cls = split_nodeid(i)[1]
        if cls is None or cls in shared:
            return False
        return wanted is None or generic_class(cls, device) in wanted

    cpu = [i for i in cpu_ids if keep(i, "cpu")]
    dev = [i for i in dev_ids if keep(i, DEVICE)]
    not_generic = sum(1 for i in cpu_ids if split_nodeid(i)[1] is None or split_nodeid(i)[1] in shared)
    return cpu, dev, not_generic


# --- pairing and classification

def of_dtypes(nodeids, device, dtypes):
    """The tests instantiated for these dtypes (comma-separated; the name's last part): a file's slice that
    runs in minutes, e.g. test_ops.py TestCommon in float32. "none" picks the tests instantiated without a
    dtype, whose name ends with the device."""
    wanted = [d.strip() for d in dtypes.split(",") if d.strip()]
    suffixes = tuple("_" + (device if d == "none" else d) for d in wanted)
    return [i for i in nodeids if i.endswith(suffixes)]


def _impossible_skip(message):
    for pat, reason in IMPOSSIBLE_SKIPS:
        if re.search(pat, message or ""):
            return reason
    return None


def _impossible_failure(tid, message):
    f = tid.split("::")[0]
    for glob, test_pat, msg_pat, reason in IMPOSSIBLE_FAILURES:
        if fnmatch.fnmatch(f, glob) and re.search(test_pat, tid) and (msg_pat is None or
                                                                       re.search(msg_pat, message or "")):
            return reason
    return None


def pair(rel_file, cpu_results, dev_results, dev_collected):
    """One row per test id: its CPU and mydev outcomes and messages, and a category:
    both-pass, mydev-fail, mydev-skip, impossible (the CPU passes in these four),
    cpu-not-passing (the CPU fails, skips or crashes), mydev-only (no CPU variant)."""
    cpu = {test_id(i, "cpu"): r for i, r in cpu_results.items()}
    dev = {test_id(i, DEVICE): r for i, r in dev_results.items()}
    dev_classes = {test_id(i, DEVICE).rsplit("::", 1)[0] for i in dev_collected}
    rows = []
    for tid in sorted(set(cpu) | set(dev)):
        c, d = cpu.get(tid), dev.get(tid)
        row = {"id": tid, "file": rel_file, "cpu": c["outcome"] if c else None, "mydev": d["outcome"] if d else None,
               "cpu_message": (c or {}).get("message", ""), "mydev_message": (d or {}).get("message", ""),
               "mydev_cause": (d or {}).get("cause", ""),
               "fallbacks": (d or {}).get("fallbacks", {}), "category": None, "reason": None}
        if c is None:
            row["category"] = "mydev-only"
        elif c["outcome"] != "pass":
            row["category"] = "cpu-not-passing"
        elif d is None:
            row["category"] = "impossible"
            row["reason"] = ABSENT_TEST if tid.rsplit("::", 1)[0] in dev_classes else ABSENT_CLASS
        elif d["outcome"] == "pass":
            row["category"] = "both-pass"
        elif d["outcome"] == "skip":
            reason = _impossible_skip(d["message"])
            row["category"], row["reason"] = ("impossible", reason) if reason else ("mydev-skip", d["message"])
        else:
            reason = _impossible_failure(tid, d["message"])
            row["category"], row["reason"] = ("impossible", reason) if reason else ("mydev-fail", None)
        rows.append(row)
    return rows


def shared_on_other_data(rows, cpu_nodeids, tests_dir, args, tmp):
    """Reruns on the CPU, under seeds 1..--seed-tries, the tests mydev fails with a numeric mismatch;
    a test the CPU fails under one of them becomes "cpu-shares", with that seed in its reason."""
    suspects = {r["id"]: r for r in rows if r["category"] == "mydev-fail" and
                re.search(MISMATCH, (r["mydev_message"] or "") + " " + (r.get("mydev_cause") or ""))}
    for seed in range(1, args.seed_tries + 1):
        if not suspects:
            break
        ids = [cpu_nodeids[t] for t in suspects]
        results = run_isolated(tests_dir, "cpu", ids, args.batch_size, args.timeout, tmp,
                               env={plugin.SEED_VAR: str(seed)})
        for nodeid, rec in results.items():
            tid = test_id(nodeid, "cpu")
            if rec["outcome"] in FAILING and tid in suspects:
                row = suspects.pop(tid)
                row["category"] = "cpu-shares"
                row["reason"] = (f"the CPU fails it too with the test framework's seed set to {seed}: "
                                 + normalise(rec["message"]))


def _pct(n, d):
    return round(100.0 * n / d, 2) if d else None


def _group(rows, key, examples=3):
    groups = collections.defaultdict(list)
    for r in rows:
        groups[key(r)].append(r["id"])
    return [{"key": k, "count": len(v), "examples": v[:examples]}
            for k, v in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


def _failure_key(r):
    label = "" if r["mydev"] == "fail" else f"[{r['mydev']}] "
    message = r["mydev_message"] or ("expected failure" if r["mydev"] == "xfail" else "")
    first = normalise(message)
    if r.get("mydev_cause") and any(re.search(p, first) for p in WRAPPERS):
        return label + normalise(r["mydev_cause"]) + f" (in {first.split(':')[-1].strip()})"
    return label + first


def figures(rows):
    cats = collections.Counter(r["category"] for r in rows)
    cpu_pass = cats["both-pass"] + cats["mydev-fail"] + cats["mydev-skip"] + cats["impossible"] + cats["cpu-shares"]
    possible = cpu_pass - cats["impossible"] - cats["cpu-shares"]
    impossible = [r for r in rows if r["category"] == "impossible"]
    fallbacks = collections.Counter()
    for r in rows:
        for op, calls in (r.get("fallbacks") or {}).items():
            fallbacks[op] += calls
    return {
        "cpu_tests": sum(r["cpu"] is not None for r in rows),
        "mydev_tests": sum(r["mydev"] is not None for r in rows),
        "cpu_passes": cpu_pass,
        "mydev_passes_of_cpu_passes": cats["both-pass"],
        "percent": _pct(cats["both-pass"], cpu_pass),
        "impossible": cats["impossible"],
        "absent_on_mydev": sum(r["mydev"] is None for r in impossible),
        "percent_excluding_impossible": _pct(cats["both-pass"], possible),
        "cpu_shares_on_other_data": cats["cpu-shares"],
        "mydev_only_failures": cats["mydev-fail"],
        "mydev_only_skips": cats["mydev-skip"],
        "crashes": sum(r["mydev"] == "crash" for r in rows),
        "cpu_not_passing": cats["cpu-not-passing"],
        "cpu_not_passing_mydev_passes": sum(r["category"] == "cpu-not-passing" and r["mydev"] == "pass" for r in rows),
        "mydev_only_tests": cats["mydev-only"],
        "cpu_outcomes": dict(collections.Counter(r["cpu"] for r in rows if r["cpu"])),
        "mydev_outcomes": dict(collections.Counter(r["mydev"] for r in rows if r["mydev"])),
        "failure_groups": _group([r for r in rows if r["category"] == "mydev-fail"], _failure_key),
        "skip_groups": _group([r for r in rows if r["category"] == "mydev-skip"], lambda r: normalise(r["reason"])),
        "impossible_groups": _group(impossible, lambda r: r["reason"]),
        "cpu_shares_groups": _group([r for r in rows if r["category"] == "cpu-shares"],
                                    lambda r: r["reason"].split(": ", 1)[-1]),
        "fallback_ops": dict(fallbacks.most_common()),
    }


def compare(rows, baseline_rows):
    """(regressions, improvements) of mydev outcomes by test id: (id, old, new). A pass that stopped
    passing regresses, and so does a skip or expected failure that now fails or crashes; only tests
    in both reports count (a narrower run is no regression)."""
    old = {r["id"]: r["mydev"] for r in baseline_rows if r.get("id") and r.get("mydev")}
    new = {r["id"]: r["mydev"] for r in rows if r.get("id") and r.get("mydev")}
    both = sorted(set(old) & set(new))
    regressions = [(i, old[i], new[i]) for i in both
                   if (old[i] == "pass" and new[i] != "pass") or (old[i] != new[i] and new[i] in FAILING
                                                                   and old[i] not in FAILING)]
    improvements = [(i, old[i], new[i]) for i in both if new[i] == "pass" and old[i] != "pass"]
    return regressions, improvements


# --- the report

def _md_escape(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(meta, files, totals, regressions=None, improvements=None, top=25):
    lines = ["# mydev on PyTorch's device-generic tests", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "notes"]
    lines += [f"- note: {n}" for n in meta.get("notes", [])]
    lines += ["", "## Summary", "",
              "Of the tests the CPU passes, the share mydev passes too; \"excl. impossible\" leaves out the "
              "tests that cannot pass on a PrivateUse1 device and those the CPU fails too on other random data "
              "(both listed per file).", "",
              "| file | CPU passes | mydev passes too | % | impossible | CPU fails on other data | % excl. impossible "
              "| mydev-only failures | mydev-only skips | crashes |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, f in list(files.items()) + [("**total**", totals)]:
        if f.get("error"):
            lines.append(f"| {name} | not run: {_md_escape(f['error'])[:200]} | | | | | | | | |")
            continue
        lines.append(f"| {name} | {f['cpu_passes']} | {f['mydev_passes_of_cpu_passes']} | {f['percent']} | "
                     f"{f['impossible']} | {f.get('cpu_shares_on_other_data', 0)} | "
                     f"{f['percent_excluding_impossible']} | {f['mydev_only_failures']} | "
                     f"{f['mydev_only_skips']} | {f['crashes']} |")
    if regressions is not None:
        lines += ["", f"## Against the baseline: {len(regressions)} regressions, {len(improvements)} improvements", ""]
        for title, items in (("Regressions", regressions), ("Improvements", improvements)):
            lines += [f"### {title}", ""] + ([f"- `{i}`: {a} -> {b}" for i, a, b in items] or ["none"]) + [""]
    for name, f in files.items():
        lines += ["", f"## {name}", ""]
        if f.get("error"):
            lines += [f"Not run: {f['error']}", ""]
            continue
        lines += [f"CPU: {f['cpu_tests']} tests ({_outcomes(f['cpu_outcomes'])}); mydev: {f['mydev_tests']} tests "
                  f"({_outcomes(f['mydev_outcomes'])}). {f['absent_on_mydev']} tests the CPU passes have no mydev "
                  f"variant. {f['not_device_generic']} tests of classes that are not device-generic not run. "
                  f"CPU fails or skips {f['cpu_not_passing']} tests "
                  f"(mydev passes {f['cpu_not_passing_mydev_passes']} of them); {f['mydev_only_tests']} tests "
                  "exist for mydev only.", ""]
        for title, key, col in (("mydev-only failures, by error", "failure_groups", "error"),
                                ("mydev-only skips, by reason", "skip_groups", "reason"),
                                ("Cannot pass on a PrivateUse1 device", "impossible_groups", "reason"),
                                ("Failures the CPU shares on other random data", "cpu_shares_groups", "CPU's error")):
            groups = f.get(key, [])
            lines += [f"### {title} ({sum(g['count'] for g in groups)} tests, {len(groups)} groups)", ""]
            if not groups:
                lines += ["none", ""]
                continue
            lines += [f"| tests | {col} | for example |", "|---:|---|---|"]
            for g in groups[:top]:
                ex = ", ".join(f"`{e.split('::')[-1]}`" for e in g["examples"])
                lines.append(f"| {g['count']} | {_md_escape(g['key'])} | {ex} |")
            if len(groups) > top:
                lines.append(f"| {sum(g['count'] for g in groups[top:])} | ({len(groups) - top} more groups in "
                             "report.json) | |")
            lines.append("")
        if f["fallback_ops"]:
            lines += ["Ops mydev served by the copying CPU fallback (calls): " + ", ".join(
                f"`{k}` {v}" for k, v in list(f["fallback_ops"].items())[:30]), ""]
    return "\n".join(lines) + "\n"


def _outcomes(counts):
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def _totals(files):
    ok = [f for f in files.values() if not f.get("error")]
    keys = ("cpu_tests", "mydev_tests", "cpu_passes", "mydev_passes_of_cpu_passes", "impossible", "absent_on_mydev",
            "cpu_shares_on_other_data",
            "mydev_only_failures", "mydev_only_skips", "crashes", "cpu_not_passing", "cpu_not_passing_mydev_passes",
            "mydev_only_tests")
    t = {k: sum(f.get(k, 0) for f in ok) for k in keys}
    t["percent"] = _pct(t["mydev_passes_of_cpu_passes"], t["cpu_passes"])
    t["percent_excluding_impossible"] = _pct(t["mydev_passes_of_cpu_passes"],
                                             t["cpu_passes"] - t["impossible"] - t["cpu_shares_on_other_data"])
    return t


def write(out, meta, files, rows, baseline_path=None):
    totals = _totals(files)
    regressions = improvements = None
    if baseline_path:
        with open(baseline_path) as f:
            regressions, improvements = compare(rows, json.load(f)["results"])
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.json"), "w") as f:
        # one result a line, so that two reports diff line by line
        head = json.dumps({"meta": meta, "totals": totals, "files": files}, indent=1, sort_keys=True)
        body = ",\n".join(json.dumps({k: v for k, v in r.items() if v not in (None, "", {}) or k in ("cpu", "mydev")},
                                     sort_keys=True) for r in rows)
        f.write(head[:-2] + ',\n "results": [\n' + body + "\n]}\n")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(markdown(meta, files, totals, regressions, improvements))
    return totals, regressions, improvements


# --- the command

def _torch_source_version(tests_dir):
    path = os.path.join(os.path.dirname(os.path.abspath(tests_dir)), "version.txt")
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def run_file(tests_dir, rel_file, args, tmp):
    """(figures, rows) of one file; figures carries "error" when the file could not be run."""
    if not os.path.isfile(os.path.join(tests_dir, rel_file)):
        return {"error": f"no file {rel_file} in {tests_dir}"}, []
    start = time.monotonic()
    cpu_ids, cpu_err = collect(tests_dir, rel_file, "cpu", tmp, args.timeout)
    dev_ids, dev_err = collect(tests_dir, rel_file, DEVICE, tmp, args.timeout)
    if cpu_err or dev_err:
        err = f"collection failed ({'cpu' if cpu_err else DEVICE}): {cpu_err or dev_err}"
        if "ImportError" in err or "cannot import" in err:
            err += " (a test file newer than torch may need its import lines patched)"
        return {"error": err}, []
    cpu_sel, dev_sel, not_generic = select(cpu_ids, dev_ids, rel_file)
    if args.dtypes:
        # Only tests instantiated for these dtypes (the name's last part): a file's slice that runs in
        # minutes, e.g. test_ops.py TestCommon in float32. "none": the tests instantiated without a
        # dtype (the name ends with the device).
        wanted = [d.strip() for d in args.dtypes.split(",") if d.strip()]

        def pick(ids, device):
            suffixes = tuple("_" + (device if d == "none" else d) for d in wanted)
            return [i for i in ids if i.endswith(suffixes)]
        cpu_sel, dev_sel = pick(cpu_sel, "cpu"), pick(dev_sel, DEVICE)
    print(f"{rel_file}: {len(cpu_sel)} CPU tests, {len(dev_sel)} {DEVICE} tests"
          f" ({not_generic} not device-generic, not run)", flush=True)
    results = {}
    for device, ids in (("cpu", cpu_sel), (DEVICE, dev_sel)):
        def progress(done, total, device=device):
            print(f"  {rel_file} [{device}] {done}/{total} tests, {(time.monotonic() - start) / 60:.1f} min",
                  flush=True)
        results[device] = run_isolated(tests_dir, device, ids, args.batch_size, args.timeout, tmp, progress)
    rows = pair(rel_file, results["cpu"], results[DEVICE], dev_sel)
    shared_on_other_data(rows, {test_id(i, "cpu"): i for i in cpu_sel}, tests_dir, args, tmp)
    figs = figures(rows)
    figs["not_device_generic"] = not_generic
    figs["classes"] = CLASS_FILTER.get(rel_file, "all device-generic")
    figs["minutes"] = round((time.monotonic() - start) / 60, 1)
    return figs, rows


def main(args, argv):
    if not args.pytorch_tests:
        sys.exit("--suite pytorch needs --pytorch-tests DIR (the test/ folder of a PyTorch checkout)")
    tests_dir = os.path.abspath(args.pytorch_tests)
    if not os.path.isdir(tests_dir):
        sys.exit(f"--pytorch-tests: no directory {tests_dir}")
    rel_files = [f.strip() for f in args.files.split(",") if f.strip()] if args.files else list(DEFAULT_FILES)
    import torch

    source_version = _torch_source_version(tests_dir)
    notes = [f"{f}: only the classes {', '.join(c)} (every op, every dtype)" for f, c in CLASS_FILTER.items()
             if f in rel_files]
    if source_version and source_version.split(".")[:2] != torch.__version__.split(".")[:2]:
        notes.append(f"the test files are of PyTorch {source_version}, torch is {torch.__version__}")
        print(f"warning: {notes[-1]}", file=sys.stderr)
    start = time.monotonic()
    files, rows = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for rel in rel_files:
            figs, file_rows = run_file(tests_dir, rel, args, tmp)
            files[rel] = figs
            rows += file_rows
            if figs.get("error"):
                print(f"{rel}: not run: {figs['error']}", flush=True)
            else:
                print(f"{rel}: mydev passes {figs['mydev_passes_of_cpu_passes']}/{figs['cpu_passes']} of the CPU's "
                      f"passes ({figs['percent']}%), {figs['percent_excluding_impossible']}% excluding "
                      f"{figs['impossible']} impossible; {figs['mydev_only_failures']} mydev-only failures, "
                      f"{figs['crashes']} crashes", flush=True)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__, "pytorch_tests": tests_dir, "pytorch_tests_version": source_version,
            "command": "python -m my_device.conformance " + " ".join(argv if argv is not None else sys.argv[1:]),
            "files": rel_files, "batch_size": args.batch_size, "timeout": args.timeout, "dtypes": args.dtypes,
            "minutes": round((time.monotonic() - start) / 60, 1), "notes": notes}
    totals, regressions, improvements = write(args.out, meta, files, rows, args.baseline)
    print(f"total: mydev passes {totals['mydev_passes_of_cpu_passes']}/{totals['cpu_passes']} of the CPU's passes "
          f"({totals['percent']}%), {totals['percent_excluding_impossible']}% excluding impossible")
    return report.print_baseline_outcome(args.baseline, regressions, improvements, args.out)
