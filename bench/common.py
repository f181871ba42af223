"""Timing shared by the benchmarks: medians of repeated timed loops, with the device synchronised."""
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
