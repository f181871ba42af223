"""RNN training steps on mydev against the CPU, in one process.

Run: python bench/bench_rnn.py [--threads N] [--repeat R]

Cases (a full training step each: forward over 32 time steps, backward, SGD step):
  lstm   nn.LSTM(64, 128, num_layers=2), batch 16 (the CPU takes oneDNN's fused LSTM; mydev too)
  gru    nn.GRU(64, 128, num_layers=2), batch 16 (no oneDNN path: ATen's cells on both)
Printed: the time per step on each device and mydev's over the CPU's (the median over rounds of
the ratio within a round; see common.paired_ratio). Target: at most 1.1x.
"""
import copy

import torch
from torch import nn

import my_device  # noqa: F401
from common import interleaved_samples, paired_ratio_interval, parse_args


def _step(model, device):
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 16, 64, generator=g).to(device)
    y = torch.randn(32, 16, 128, generator=g).to(device)

    def step():
        opt.zero_grad()
        out, _ = model(x)
        nn.functional.mse_loss(out, y).backward()
        opt.step()

    return step


def main():
    args = parse_args(__doc__, repeat=9)
    sync = torch.mydev.synchronize
    for name, cls in (("lstm", nn.LSTM), ("gru", nn.GRU)):
        torch.manual_seed(0)
        model = cls(64, 128, num_layers=2)
        samples = interleaved_samples({"cpu": (_step(model, "cpu"), lambda: None),
                                       "mydev": (_step(model, "mydev"), sync)}, inner=10, repeat=args.repeat)
        cpu = sorted(samples["cpu"])[len(samples["cpu"]) // 2]
        dev = sorted(samples["mydev"])[len(samples["mydev"]) // 2]
        low, ratio, high = paired_ratio_interval(samples, "mydev", "cpu")
        print(f"{name:5s} step: cpu {cpu * 1e3:7.2f} ms, mydev {dev * 1e3:7.2f} ms, "
              f"mydev/cpu {ratio:5.2f}x (95% interval {low:.2f}-{high:.2f})", flush=True)


if __name__ == "__main__":
    main()
