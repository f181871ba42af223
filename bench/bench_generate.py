"""Greedy decoding with transformers' GPT-2 on mydev against the CPU, in one process.

Run: python bench/bench_generate.py [--threads N] [--repeat R] [--perf] [--against-itself]

A 2-layer GPT-2 (embedding 128, 4 heads, vocabulary 1000, built from a config: no download) generates
20 new tokens greedily from a 8-token prompt (`model.generate(..., do_sample=False)`), as a decoding
loop does: one forward per token on the cached keys and values, then the stopping checks, which read
a device value on the host each token (so the host waits for the device every token, as on CUDA).
Printed: the time per generate call on each device and mydev's over the CPU's (median over rounds
of the ratio within a round). Target: at most 1.0x.

--perf: records the host thread with Linux `perf` while the two cases take turns and prints, for each
device, the host's samples per generate call by library, and the symbols whose samples differ most:
where mydev's host spends time the CPU's does not, and the reverse, measured in the same periods of
the machine.

--against-itself: an A/A check of the method. A second copy of the model on the CPU takes mydev's
place, so the printed ratio is what this measurement gives for two paths of equal cost; read a
mydev run against its spread.
"""
import bisect
import collections
import copy
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import torch
import transformers

import my_device  # noqa: F401
from common import interleaved_samples, paired_ratio_interval, parse_args


def main():
    # 120 rounds (about half a minute): one round's ratio scatters about -10/+15% around the median
    # with the machine's speed, which swings 1.5-2x within seconds here, so forty rounds left each
    # run's median uncertain by about 5% (its printed interval) and nine by more; 120 narrow it to
    # about 2.5%, enough to tell a ratio of 0.96 from 1.0 in one run.
    def extra(p):
        p.add_argument("--perf", action="store_true", help="profile the host thread of each case with Linux perf")
        p.add_argument("--against-itself", action="store_true",
                       help="time a second copy of the model on the CPU in mydev's place (an A/A check)")

    args = parse_args(__doc__, repeat=120, extra=extra)
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=1000, n_positions=64, n_embd=128, n_layer=2, n_head=4)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    prompt = torch.randint(0, 1000, (1, 8))
    cases = {}
    second, second_device = ("cpu copy", "cpu") if args.against_itself else ("mydev", "mydev")
    for name, device in (("cpu", "cpu"), (second, second_device)):
        m = copy.deepcopy(model).to(device)
        p = prompt.to(device)
        mask = torch.ones_like(p)

        def run(m=m, p=p, mask=mask):
            with torch.no_grad():
                return m.generate(p, attention_mask=mask, max_new_tokens=20, do_sample=False,
                                  pad_token_id=0)

        cases[name] = (run, torch.mydev.synchronize if device == "mydev" else (lambda: None))
    assert torch.equal(cases["cpu"][0](), cases[second][0]().cpu())
    if args.perf:
        host_profile(cases, inner=3, repeat=args.repeat)
        return
    samples = interleaved_samples(cases, inner=3, repeat=args.repeat)
    med = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
    low, ratio, high = paired_ratio_interval(samples, second, "cpu")
    print(f"generate 20 tokens: cpu {med['cpu'] * 1e3:7.2f} ms, {second} {med[second] * 1e3:7.2f} ms, "
          f"{second}/cpu {ratio:5.2f}x (95% interval {low:.2f}-{high:.2f})", flush=True)


def host_profile(cases, inner, repeat, rate=2999, shown=15):
    """Samples of this (the host) thread per generate call on each device, by library and by symbol,
    each sample counted to the case whose timed span it fell in."""
    if shutil.which("perf") is None:
        raise SystemExit("--perf needs Linux perf on the PATH")
    spans = []
    fd, data = tempfile.mkstemp(suffix=".perf")
    os.close(fd)
    recorder = subprocess.Popen(
        ["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-F", str(rate), "-t", str(threading.get_native_id()),
         "-o", data], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # perf attaches
        if recorder.poll() is not None:
            raise SystemExit(f"perf record could not start: {recorder.stderr.read().strip()}")
        interleaved_samples(cases, inner=inner, repeat=repeat, spans=spans)
    finally:
        if recorder.poll() is None:
            recorder.send_signal(signal.SIGINT)
            recorder.wait()
    try:
        script = subprocess.run(["perf", "script", "-i", data, "-F", "time,ip,sym,dso"], capture_output=True,
                                text=True, check=True).stdout
    finally:
        os.unlink(data)
    spans.sort(key=lambda s: s[1])
    starts = [s[1] for s in spans]
    by_lib = collections.defaultdict(collections.Counter)
    by_sym = collections.defaultdict(collections.Counter)
    for line in script.splitlines():
        m = re.match(r"\s*([\d.]+):\s+[0-9a-f]+\s+(.*?)(\+0x[0-9a-f]+)?\s+\(([^()]*)\)\s*$", line)
        if not m:
            continue
        t = float(m.group(1))
        i = bisect.bisect_right(starts, t) - 1
        if i < 0 or t > spans[i][2]:
            continue  # between samples: the settling pause, the other bookkeeping
        name, lib = spans[i][0], os.path.basename(m.group(4))
        by_lib[name][lib] += 1
        by_sym[name][f"{lib[:16]:16s} {m.group(2)[:100]}"] += 1
    calls = inner * repeat
    per_call = {name: sum(by_lib[name].values()) / calls for name in cases}
    print(f"host samples per generate call ({rate} Hz): " +
          ", ".join(f"{name} {n:.1f}" for name, n in per_call.items()))
    first, second = cases  # the CPU, and mydev (or the CPU's second copy: --against-itself)
    print(f"{'library':40s} {first:>8s} {second:>8s} {'difference':>10s}")
    libs = set(by_lib[first]) | set(by_lib[second])
    for lib in sorted(libs, key=lambda k: -(by_lib[first][k] + by_lib[second][k]))[:shown]:
        c, d = by_lib[first][lib] / calls, by_lib[second][lib] / calls
        print(f"{lib[:40]:40s} {c:8.2f} {d:8.2f} {d - c:+10.2f}")
    syms = set(by_sym[first]) | set(by_sym[second])
    order = sorted(syms, key=lambda k: by_sym[second][k] - by_sym[first][k])
    for title, keys in ((f"{second}'s host more", order[::-1][:shown]), (f"{first}'s host more", order[:shown])):
        print(f"-- {title} (samples per call: {first}, {second}, difference)")
        for k in keys:
            c, d = by_sym[first][k] / calls, by_sym[second][k] / calls
            print(f"{c:6.2f} {d:6.2f} {d - c:+6.2f}  {k}")


if __name__ == "__main__":
    main()
