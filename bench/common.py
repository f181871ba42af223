"""Timing shared by the benchmarks: medians of repeated timed loops, with the device synchronised."""
import argparse
import math
import statistics
import time


def median_seconds(fn, inner: int, repeat: int = 9, sync=lambda: None) -> float:
    """Median over `repeat` runs of the mean time of `fn` over `inner` calls (after one warm-up call)."""
    fn()
    sync()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


# The pause before each timed sample of interleaved_samples: a sample taken right after the CPU's ran on cores its
# OpenMP threads were still spinning on, so a case that follows a CPU case in some rounds lost time to a cause
# outside it (bench/RESULTS.md, "Samples after quiet").
SETTLE_SECONDS = 0.05


def interleaved_samples(cases: dict, inner: int, repeat: int = 9, spans: list | None = None) -> dict:
    """Mean seconds per call of each case ({name: (fn, sync)}) over `inner` calls, `repeat` times, the
    cases taking turns (the order reversed every other round) so that all of them sample the same
    periods of the machine: on these VMs a period of slower execution lasting seconds made one of two
    back-to-back measurements up to 1.7x slower than the other. Each sample starts after SETTLE_SECONDS
    of quiet. Returns {name: [one sample per round]}; `spans`, if given, gets each sample's (name, start,
    end) on CLOCK_MONOTONIC, the clock `perf record -k CLOCK_MONOTONIC` stamps its samples with."""
    for fn, sync in cases.values():
        fn()
        sync()
    samples = {name: [] for name in cases}
    names = list(cases)
    for r in range(repeat):
        for name in (names if r % 2 == 0 else names[::-1]):
            fn, sync = cases[name]
            time.sleep(SETTLE_SECONDS)
            start = time.monotonic()  # CLOCK_MONOTONIC, as fine as perf_counter on Linux
            for _ in range(inner):
                fn()
            sync()
            end = time.monotonic()
            samples[name].append((end - start) / inner)
            if spans is not None:
                spans.append((name, start, end))
    return samples


def interleaved_medians(cases: dict, inner: int, repeat: int = 9) -> dict:
    """The median of each case's interleaved_samples."""
    return {name: statistics.median(v) for name, v in interleaved_samples(cases, inner, repeat).items()}


def paired_ratio(samples: dict, num: str, den: str) -> float:
    """The median over rounds of num's time over den's in the same round (interleaved_samples). The
    machine's speed changes within milliseconds as well as between seconds (an L1-resident pointer
    chase measured 1.3 to 3.8 ns per step a few seconds apart): a ratio within one round, whose two
    samples ran back to back, cancels what a ratio of the two medians of a whole run does not."""
    return statistics.median(round_ratios(samples, num, den))


def round_ratios(samples: dict, num: str, den: str) -> list:
    """num's time over den's in each round of interleaved_samples."""
    return [a / b for a, b in zip(samples[num], samples[den])]


def median_interval(values, z: float = 1.96) -> tuple:
    """(low, median, high): the median of `values` with a distribution-free interval of about 95%
    around it (z = 1.96). The median's rank in a sorted sample of n is a binomial(n, 1/2) variable, so
    order statistics n/2 -+ z*sqrt(n)/2 bound it whatever the distribution. A run's median ratio is one
    draw: with forty rounds the interval is about the 14th to the 27th of them, and two runs whose
    intervals overlap do not show a change between them."""
    v = sorted(values)
    n = len(v)
    half = z * n ** 0.5 / 2
    low, high = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half) - 1)
    return v[low], statistics.median(v), v[high]


def paired_ratio_interval(samples: dict, num: str, den: str) -> tuple:
    """paired_ratio with its interval (median_interval): (low, median, high)."""
    return median_interval(round_ratios(samples, num, den))


def parse_args(doc: str, repeat: int, extra=None):
    """The benchmarks' command line (--threads, --repeat, and what `extra(parser)` adds); applies
    --threads and prints the setting."""
    import torch

    global SETTLE_SECONDS
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--repeat", type=int, default=repeat, help="timed repetitions per case")
    parser.add_argument("--settle", type=float, default=SETTLE_SECONDS,
                        help=f"seconds of quiet before each sample of the scripts whose cases take turns (default {SETTLE_SECONDS})")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    SETTLE_SECONDS = args.settle
    print(f"torch {torch.__version__}, {args.threads} intra-op thread(s), --repeat {args.repeat}, --settle {args.settle}")
    return args
