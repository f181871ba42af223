"""Random numbers on mydev: per-device generators, seeds, states, offsets, independence from CPU."""
import torch


def test_manual_seed_reproducible_and_independent_of_cpu():
    torch.mydev.manual_seed(3)
    cpu_state = torch.get_rng_state()
    a = torch.randn(50, device="mydev")
    assert torch.equal(torch.get_rng_state(), cpu_state)
    torch.mydev.manual_seed(3)
    b = torch.randn(50, device="mydev")
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)
    assert torch.mydev.initial_seed() == 3
    assert abs(a.cpu().mean().item()) < 0.5


def test_torch_manual_seed_seeds_every_device():
    torch.manual_seed(11)
    a0, a1 = torch.rand(5, device="mydev:0"), torch.rand(5, device="mydev:1")
    torch.manual_seed(11)
    b0, b1 = torch.rand(5, device="mydev:0"), torch.rand(5, device="mydev:1")
    torch.testing.assert_close(a0.cpu(), b0.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(a1.cpu(), b1.cpu(), rtol=0, atol=0)


def test_rng_state_round_trip_and_devices_are_independent():
    torch.mydev.manual_seed(7)
    state = torch.mydev.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = torch.rand(10, device="mydev")
    torch.rand(10, device="mydev:1")  # another device's generator does not move device 0's
    torch.mydev.set_rng_state(state)
    b = torch.rand(10, device="mydev")
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)
    states = torch.mydev.get_rng_state_all()
    assert len(states) == 2
    c = [torch.rand(3, device=f"mydev:{i}") for i in range(2)]
    torch.mydev.set_rng_state_all(states)
    d = [torch.rand(3, device=f"mydev:{i}") for i in range(2)]
    for x, y in zip(c, d):
        torch.testing.assert_close(x.cpu(), y.cpu(), rtol=0, atol=0)


def test_generator_object_offsets():
    g = torch.Generator(device="mydev")
    assert g.device == torch.device("mydev:0")
    g.manual_seed(1)
    assert g.get_offset() == 0
    first = torch.randn(4, generator=g, device="mydev")
    offset = g.get_offset()
    assert offset > 0
    second = torch.randn(4, generator=g, device="mydev")
    g.set_offset(offset)
    again = torch.randn(4, generator=g, device="mydev")
    torch.testing.assert_close(again.cpu(), second.cpu(), rtol=0, atol=0)
    assert not torch.equal(first.cpu(), second.cpu())
    clone = g.clone_state()
    torch.testing.assert_close(torch.rand(3, generator=g, device="mydev").cpu(),
                               torch.rand(3, generator=clone, device="mydev").cpu(), rtol=0, atol=0)


def test_fork_rng_restores_mydev_state():
    torch.mydev.manual_seed(9)
    before = torch.mydev.get_rng_state()
    with torch.random.fork_rng(devices=[0, 1], device_type="mydev"):
        torch.rand(5, device="mydev")
    assert torch.equal(torch.mydev.get_rng_state(), before)


def test_random_ops_reproducible():
    for op in (lambda g: torch.rand(6, device="mydev", generator=g),
               lambda g: torch.randint(0, 100, (6,), device="mydev", generator=g),
               lambda g: torch.randperm(6, device="mydev", generator=g),
               lambda g: torch.empty(6, device="mydev").normal_(generator=g),
               lambda g: torch.empty(6, device="mydev").bernoulli_(0.5, generator=g),
               lambda g: torch.multinomial(torch.ones(6, device="mydev"), 3, generator=g)):
        a = op(torch.Generator(device="mydev").manual_seed(4))
        b = op(torch.Generator(device="mydev").manual_seed(4))
        assert a.device.type == "mydev"
        torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)


def test_first_random_ops_and_inits_import_no_compiler_module(python_subprocess):
    # A new signature's first run gives its answer; no Meta kernel is asked.
    # Most of torch's Meta kernels are Python references whose first run
    # imports torch._dynamo and sympy (seconds, where the CPU op takes 0.3 ms).
    r = python_subprocess("""
        import sys
        import torch
        from torch import nn
        d = "mydev"
        torch.randn(3, device=d); torch.rand(3, device=d); torch.randint(0, 5, (3,), device=d)
        torch.randperm(5, device=d); torch.multinomial(torch.ones(4, device=d), 2)
        torch.normal(torch.zeros(3, device=d), 1.0); torch.bernoulli(torch.full((3,), 0.5, device=d))
        nn.functional.dropout(torch.ones(8, device=d), 0.5)
        for init in (nn.init.normal_, nn.init.uniform_, nn.init.trunc_normal_, nn.init.xavier_normal_,
                     nn.init.kaiming_uniform_, nn.init.orthogonal_):
            init(torch.empty(3, 3, device=d))
        for fill in ("exponential_", "geometric_", "cauchy_", "log_normal_", "random_"):
            getattr(torch.empty(3, device=d), fill)(*((0.5,) if fill == "geometric_" else ()))
        nn.Linear(4, 4, device=d)(torch.ones(2, 4, device=d)).sum().backward()
        torch.mydev.synchronize()
        print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout
