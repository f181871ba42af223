"""Device graphs: a captured training step replayed, against the same step run eagerly, in one process.

Run: python bench/bench_graphs.py [--threads N] [--repeat R]

Cases (a full training step each: forward, backward, an AdamW step; capturable=True where captured):
  tiny         Linear(16,16)-Tanh-Linear(16,4), batch 4: launch-bound, every kernel a few hundred elements
  transformer  nn.TransformerEncoderLayer(128, 4 heads, feed-forward 256, dropout 0.1), batch 8 x 32 tokens
The graph's step copies the batch into the static inputs, then replays. "reduce-overhead" is the same
step with the model under torch.compile(mode="reduce-overhead") (its forward and backward replayed as
graphs; the optimizer step eager). Printed per case: the time per step of eager mydev, of the replay, of
reduce-overhead and of eager CPU; ratios (the median over rounds of the ratio within a round:
common.paired_ratio); the capture's and the instantiation's time. Targets: tiny replay at most 0.25x
eager mydev, transformer at most 0.9x.
"""
import copy
import time

import torch
from torch import nn

import my_device  # noqa: F401
from common import interleaved_samples, paired_ratio, parse_args

DEV = "mydev"


def _case(name):
    torch.manual_seed(0)
    if name == "tiny":
        model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
        x, y = torch.randn(4, 16), torch.randn(4, 4)
    else:
        model = nn.TransformerEncoderLayer(128, 4, dim_feedforward=256, dropout=0.1, batch_first=True)
        x, y = torch.randn(8, 32, 128), torch.randn(8, 32, 128)
    return model, x, y


def _eager(model, x, y, device):
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # (eager: the default, not capturable)
    x, y = x.to(device), y.to(device)

    def step():
        opt.zero_grad(set_to_none=False)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return step


def _reduce_overhead(model, x, y):
    model = copy.deepcopy(model).to(DEV)
    compiled = torch.compile(model, mode="reduce-overhead")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    x, y = x.to(DEV), y.to(DEV)

    def step():
        # Gradients set to None, as cudagraph trees require (on CUDA too): zeroed ones would be the
        # recording's outputs, accumulated into after the next replay overwrote them.
        opt.zero_grad()
        nn.functional.mse_loss(compiled(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    return step


def _graphed(model, x, y):
    model = copy.deepcopy(model).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    x, y = x.to(DEV), y.to(DEV)
    static_x, static_y = torch.zeros_like(x), torch.zeros_like(y)

    def step():
        opt.zero_grad(set_to_none=False)
        nn.functional.mse_loss(model(static_x), static_y).backward()
        opt.step()

    side = torch.mydev.Stream()
    side.wait_stream(torch.mydev.current_stream())
    with torch.mydev.stream(side):
        for _ in range(3):
            step()
    torch.mydev.current_stream().wait_stream(side)
    torch.mydev.synchronize()
    g = torch.mydev.MyDevGraph(keep_graph=True)
    start = time.perf_counter()
    with torch.mydev.graph(g):
        step()
    captured = time.perf_counter()
    g.instantiate()
    instantiated = time.perf_counter()

    def replay():
        static_x.copy_(x)
        static_y.copy_(y)
        g.replay()

    return replay, captured - start, instantiated - captured


def main():
    args = parse_args(__doc__, repeat=9)
    sync = torch.mydev.synchronize
    for name, inner in (("tiny", 200), ("transformer", 10)):
        model, x, y = _case(name)
        replay, capture_s, instantiate_s = _graphed(model, x, y)
        samples = interleaved_samples({"cpu": (_eager(model, x, y, "cpu"), lambda: None),
                                       "eager": (_eager(model, x, y, DEV), sync),
                                       "graph": (replay, sync),
                                       "reduce-overhead": (_reduce_overhead(model, x, y), sync)},
                                      inner=inner, repeat=args.repeat)
        med = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
        print(f"{name:11s} step: eager mydev {med['eager'] * 1e6:8.1f} us, graph {med['graph'] * 1e6:8.1f} us, "
              f"reduce-overhead {med['reduce-overhead'] * 1e6:8.1f} us, cpu {med['cpu'] * 1e6:8.1f} us | "
              f"graph/eager {paired_ratio(samples, 'graph', 'eager'):5.2f}x, "
              f"reduce-overhead/eager {paired_ratio(samples, 'reduce-overhead', 'eager'):5.2f}x, "
              f"graph/cpu {paired_ratio(samples, 'graph', 'cpu'):5.2f}x, eager/cpu "
              f"{paired_ratio(samples, 'eager', 'cpu'):5.2f}x | capture {capture_s * 1e3:.1f} ms, "
              f"instantiate {instantiate_s * 1e3:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
