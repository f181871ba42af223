"""What a call frame costs around a kernel: why the at-call launch path is inlined.

Run: python bench/bench_call_depth.py [--device cpu|mydev]

Wraps a small op (the sum of a (4, 16) float32 tensor) in k do-nothing C++ frames, k = 0..16,
and the same frames around a function that does nothing, and prints the cost of one frame in
each case (least-squares slope over k, medians of rounds that alternate the depths).

On 2-vCPU AMD EPYC machines a frame around the sum cost 5.1-6.0 ns, 3.7-4.4 times
what it cost around the trivial function (1.4 ns). Taking eight of our frames out of a short sum's
path cut 50-90 ns of its 1.1 us. That is why the frames between an op and a kernel it runs at the
call are inlined: MYDEV_ALWAYS_INLINE in csrc/core/Launch.h and StructuredKernel.h, and the
runtime's caller tasks (mydevStreamBeginCallerTask), which let the kernel body run under the op's
own frame rather than under a launch and a trampoline. (A first version of this measurement,
built without optimisation, read 23 ns per frame: its frames moved and destroyed a Tensor each.)

The extension is compiled on first use (about a minute) into torch's extension cache.
"""
import argparse
import statistics

import torch
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
#include <chrono>

namespace {
// Each level is its own frame: noinline, and work after the call keeps it from
// becoming a tail call.
__attribute__((noinline)) at::Tensor wrap_sum(const at::Tensor& a, int k) {
  if (k == 0) return a.sum();
  at::Tensor r = wrap_sum(a, k - 1);
  asm volatile("" ::: "memory");
  return r;
}
__attribute__((noinline)) int leaf(int x) {
  asm volatile("" ::: "memory");
  return x + 1;
}
__attribute__((noinline)) int wrap_leaf(int x, int k) {
  if (k == 0) return leaf(x);
  int r = wrap_leaf(x, k - 1);
  asm volatile("" ::: "memory");
  return r + 1;
}
template <class F>
double ns_per_call(int64_t n, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) f(i);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}
}  // namespace

double sum_at_depth(const at::Tensor& a, int64_t k, int64_t n) {
  return ns_per_call(n, [&](int64_t) { at::Tensor c = wrap_sum(a, static_cast<int>(k)); });
}

double leaf_at_depth(int64_t k, int64_t n) {
  int s = 0;
  const double ns = ns_per_call(n, [&](int64_t i) { s += wrap_leaf(static_cast<int>(i), static_cast<int>(k)); });
  asm volatile("" ::"r"(s));
  return ns;
}
"""

DEPTHS = [0, 2, 4, 6, 8, 12, 16]


def slope(points):
    """Least-squares slope of (depth, ns) points: ns per frame."""
    xs, ys = zip(*points)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    if args.device.startswith("mydev"):
        import my_device  # noqa: F401
    torch.set_num_threads(1)
    ext = load_inline("mydev_bench_call_depth", cpp_sources=[SOURCE],
                      functions=["sum_at_depth", "leaf_at_depth"], extra_cflags=["-O2"])
    a = torch.randn(4, 16, device=args.device)
    sums = {k: [] for k in DEPTHS}
    leaves = {k: [] for k in DEPTHS}
    for _ in range(args.rounds):
        for k in DEPTHS:
            sums[k].append(ext.sum_at_depth(a, k, 3000))
            leaves[k].append(ext.leaf_at_depth(k, 200_000))
        if args.device != "cpu":
            torch.accelerator.synchronize()
    sum_med = {k: statistics.median(v) for k, v in sums.items()}
    leaf_med = {k: statistics.median(v) for k, v in leaves.items()}
    print(f"torch {torch.__version__}, {args.device}, 1 intra-op thread, medians of {args.rounds} rounds")
    print("depth  " + "".join(f"{k:>8d}" for k in DEPTHS))
    print("sum    " + "".join(f"{sum_med[k]:8.0f}" for k in DEPTHS) + "   ns per call")
    print("trivial" + "".join(f"{leaf_med[k]:8.1f}" for k in DEPTHS) + "   ns per call")
    per_sum, per_leaf = slope(sum_med.items()), slope(leaf_med.items())
    print(f"one frame around the sum: {per_sum:.1f} ns; around a trivial function: {per_leaf:.1f} ns "
          f"({per_sum / per_leaf:.1f}x)")


if __name__ == "__main__":
    main()
