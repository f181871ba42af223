"""Greedy decoding with transformers' GPT-2 on mydev against the CPU, in one process.

Run: python bench/bench_generate.py [--threads N] [--repeat R]

A 2-layer GPT-2 (embedding 128, 4 heads, vocabulary 1000, built from a config: no download) generates
20 new tokens greedily from a 8-token prompt (`model.generate(..., do_sample=False)`), as a decoding
loop does: one forward per token on the cached keys and values, then the stopping checks, which read
a device value on the host each token (so the host waits for the device every token, as on CUDA).
Printed: the time per generate call on each device and mydev's over the CPU's (median over rounds
of the ratio within a round). Target: at most 1.0x.
"""
import copy

import torch
import transformers

import my_device  # noqa: F401
from common import interleaved_samples, paired_ratio, parse_args


def main():
    # Forty rounds: with nine, one run's ratio moved 0.84-1.15x with the machine's speed (which
    # swings 1.5-2x within seconds here), against 0.88-0.92x over sixty.
    args = parse_args(__doc__, repeat=40)
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=1000, n_positions=64, n_embd=128, n_layer=2, n_head=4)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    prompt = torch.randint(0, 1000, (1, 8))
    cases = {}
    for device in ("cpu", "mydev"):
        m = copy.deepcopy(model).to(device)
        p = prompt.to(device)
        mask = torch.ones_like(p)

        def run(m=m, p=p, mask=mask):
            with torch.no_grad():
                return m.generate(p, attention_mask=mask, max_new_tokens=20, do_sample=False,
                                  pad_token_id=0)

        cases[device] = (run, torch.mydev.synchronize if device == "mydev" else (lambda: None))
    assert torch.equal(cases["cpu"][0](), cases["mydev"][0]().cpu())
    samples = interleaved_samples(cases, inner=3, repeat=args.repeat)
    med = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
    print(f"generate 20 tokens: cpu {med['cpu'] * 1e3:7.2f} ms, mydev {med['mydev'] * 1e3:7.2f} ms, "
          f"mydev/cpu {paired_ratio(samples, 'mydev', 'cpu'):5.2f}x", flush=True)


if __name__ == "__main__":
    main()
