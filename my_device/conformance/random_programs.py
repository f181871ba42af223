"""Random programs made of OpInfo samples, for the fuzzer (fuzz.py).

A program is a chain of OpInfo calls, each with one of the op's own float32 sample inputs, where a step takes
the value an earlier step made in place of the sample's tensor of the same shape and dtype, so ops feed one
another as in a model; the sample's other tensors become the program's inputs. Steps whose CPU result is not a
finite, moderate tensor are dropped while the program is made, and so are calls that draw random numbers, so
that each program has one right answer: its result on the CPU.

Programs are made from a seed alone (random.Random and torch's seed), so a worker process rebuilds the very
program the parent named.
"""
import random
import zlib

import torch

from .frontends import _tree_map

_MAX_SAMPLES = 12
# OpInfos the fuzzer leaves out, each for a reason that is not mydev's (manifest.py has the same ones).
_EXCLUDED = {
    "as_strided.partial_views": "reads storage outside its view, which .to(device) does not copy",
    "tensor_split": "takes an index tensor that must stay on the CPU",
    "to": "converts to an explicit device",
}


class _Slot:
    """A tensor's place in a step's arguments: value `id` of the program."""
    __slots__ = ("id",)

    def __init__(self, i):
        self.id = i


def _template(x, tensors):
    """x with each tensor replaced by a _Slot numbered in `tensors` (appended to)."""
    def slot(t):
        tensors.append(t)
        return _Slot(len(tensors) - 1)

    return _tree_map(slot, x)


def _fill(x, values):
    return _tree_map(lambda s: values[s.id], x, _Slot)


def _renumber(x, ids):
    return _tree_map(lambda s: _Slot(ids[s.id]), x, _Slot)


class Step:
    __slots__ = ("opinfo", "call")

    def __init__(self, opinfo, call):
        self.opinfo, self.call = opinfo, call  # call: (input, args, kwargs) with _Slots

    def __call__(self, values):
        inp, args, kwargs = _fill(self.call, values)
        return self.opinfo.op(inp, *args, **kwargs)


class Program:
    def __init__(self, seed):
        self.seed = seed
        self.inputs = []      # CPU tensors
        self.steps = []
        self.outputs = []     # value ids: the step results no later step reads

    def __call__(self, *inputs):
        values = list(inputs)
        for step in self.steps:
            values.append(step(values))
        return tuple(values[i] for i in self.outputs)

    def describe(self):
        n = len(self.inputs)
        lines = [f"program {self.seed}: inputs " + ", ".join(
            f"v{i} {str(t.dtype).replace('torch.', '')}{list(t.shape)}" for i, t in enumerate(self.inputs))]

        def show(x):
            if isinstance(x, _Slot):
                return f"v{x.id}"
            if isinstance(x, (list, tuple)):
                return "[" + ", ".join(show(e) for e in x) + "]"
            if isinstance(x, dict):
                return ", ".join(f"{k}={show(v)}" for k, v in x.items())
            return repr(x)

        for k, step in enumerate(self.steps):
            inp, args, kwargs = step.call
            parts = [show(inp), *(show(a) for a in args)] + ([show(kwargs)] if kwargs else [])
            lines.append(f"  v{n + k} = {step.opinfo.full_name}({', '.join(parts)})")
        lines.append("  return " + ", ".join(f"v{i}" for i in self.outputs))
        return "\n".join(lines)


def pool(names=None):
    """The OpInfos programs are made of: those named (names or full names), else every OpInfo with a
    float32 CPU kernel, less _EXCLUDED."""
    from torch.testing._internal.common_methods_invocations import op_db

    wanted = set(names) if names else None
    return [op for op in op_db
            if (wanted is None or op.name in wanted or op.full_name in wanted)
            and op.full_name not in _EXCLUDED and not any(r in op.name for r in _RANDOM)
            and "empty" not in op.name  # (empty, empty_like, new_empty...: their values are whatever memory held)
            and torch.float32 in op.supported_dtypes("cpu")]


_samples_cache = {}
# Ops that draw random numbers: the CPU's draws are not mydev's (its generator is its own, as CUDA's is), and
# OpInfo wraps them in a reseeding that hides the draws from make()'s check.
_RANDOM = ("normal", "uniform", "bernoulli", "rand", "dropout", "multinomial", "exponential", "cauchy",
           "geometric", "poisson")


def _names_a_device(x):
    """A sample that passes a device (device="cpu") makes its result there, whatever the program's device."""
    if isinstance(x, (torch.device, str)):
        return isinstance(x, torch.device) or x in ("cpu", "cuda")
    if isinstance(x, (list, tuple)):
        return any(_names_a_device(e) for e in x)
    if isinstance(x, dict):
        return any(_names_a_device(e) for e in x.values())
    return False


def _samples(opinfo):
    key = opinfo.full_name
    if key not in _samples_cache:
        torch.manual_seed(zlib.crc32(key.encode()))
        found = []
        try:
            for s in opinfo.sample_inputs("cpu", torch.float32, requires_grad=False):
                tensors = []
                call = _template((s.input, tuple(s.args), dict(s.kwargs)), tensors)
                if tensors and isinstance(s.input, torch.Tensor) and all(t.layout == torch.strided for t in tensors) \
                        and not _names_a_device(call):
                    found.append((call, tensors))
                if len(found) == _MAX_SAMPLES:
                    break
        except Exception:  # an OpInfo whose samples cannot be made on this build
            found = []
        _samples_cache[key] = found
    return _samples_cache[key]


def _acceptable(result):
    if not isinstance(result, torch.Tensor) or result.layout != torch.strided or result.is_complex():
        return False
    if result.dtype.is_floating_point:
        return bool(result.numel() == 0 or (torch.isfinite(result).all() and result.abs().max() < 1e4))
    return result.dtype in (torch.int64, torch.bool)


def _drawing(step, values):
    """step(values), and whether it drew random numbers: OpInfo calls random ops (dropout_p in attention,
    fractional pooling, rrelu) through a reseeding wrapper that restores the generator, so a draw shows as a
    call of torch.manual_seed or as a changed generator state."""
    seeded = []
    original = torch.manual_seed
    torch.manual_seed = lambda seed: (seeded.append(seed), original(seed))[1]
    state = torch.random.get_rng_state()
    try:
        result = step(values)
    finally:
        torch.manual_seed = original
    return result, bool(seeded) or not torch.equal(state, torch.random.get_rng_state())


def _chain(values, made, ops, rng, tries=40):
    """(OpInfo, sample, value) where the sample's input has the shape and dtype of a value a step made
    (the newest most often), looked for among `tries` random OpInfos; None if none has one."""
    source = made[-1] if rng.random() < 0.6 else rng.choice(made)
    want = (values[source].shape, values[source].dtype)
    for opinfo in rng.sample(ops, min(tries, len(ops))):
        matching = [s for s in _samples(opinfo) if (s[1][0].shape, s[1][0].dtype) == want]
        if matching:
            return opinfo, rng.choice(matching), source
    return None


def make(seed, ops, length=4):
    """The program of `seed`: up to `length` steps of the OpInfos `ops`."""
    rng = random.Random(seed)
    program = Program(seed)
    values = []   # CPU values: the inputs, then the steps' results
    made = []     # value ids that steps made
    for _ in range(length * 25):
        if len(program.steps) == length:
            break
        chained = _chain(values, made, ops, rng) if made and rng.random() < 0.8 else None
        if chained is not None:
            opinfo, (call, tensors), source = chained
        else:
            opinfo = rng.choice(ops)
            samples = _samples(opinfo)
            if not samples:
                continue
            call, tensors = samples[rng.randrange(len(samples))]
        trial = list(values)
        slots = []
        for k, t in enumerate(tensors):
            if k == 0 and chained is not None:
                slots.append(source)
                continue
            same = [v for v in made if values[v].shape == t.shape and values[v].dtype == t.dtype]
            if same and rng.random() < (0.9 if k == 0 else 0.5):
                slots.append(same[-1] if rng.random() < 0.7 else rng.choice(same))
            else:
                trial.append(t.clone())  # a new input of the program
                slots.append(len(trial) - 1)
        step = Step(opinfo, _renumber(call, slots))
        try:
            first, draws = _drawing(step, trial)
        except Exception:
            continue
        if draws or not _acceptable(first):
            continue
        values = trial
        values.append(first)
        made.append(len(values) - 1)
        program.steps.append(step)
    return _numbered_inputs_first(program, values, made)


def _numbered_inputs_first(program, values, made):
    """The program with its inputs as values 0..n-1 and the steps' results after them (the order the
    program's call takes)."""
    made_set = set(made)
    inputs = [v for v in range(len(values)) if v not in made_set]
    order = inputs + made
    new_id = {old: new for new, old in enumerate(order)}
    program.inputs = [values[v] for v in inputs]
    for step in program.steps:
        step.call = _renumber(step.call, [new_id[i] for i in range(len(values))])
    read = set()
    for step in program.steps:
        _tree_map(lambda slot: read.add(slot.id), step.call, _Slot)
    program.outputs = [new_id[v] for v in made if new_id[v] not in read]
    return program


def run(program, device, through, trains, weights=None, dtype=None):
    """program's outputs and input gradients with its inputs on `device` (its float32 inputs in `dtype`, if
    given), called as through(program)."""
    gen = torch.Generator().manual_seed(program.seed)
    cast = (lambda t: t.to(dtype) if dtype is not None and t.dtype == torch.float32 else t)  # noqa: E731
    # (copies, on the CPU too: a program may write into its inputs, instance_norm's running statistics, and the
    # next run, the mydev one, must start from the same values)
    leaves = [cast(t.detach()).to(device, copy=True).requires_grad_(trains and t.is_floating_point())
              for t in program.inputs]
    outputs = through(program)(*leaves)
    if not trains:
        return [o.detach() for o in outputs], [], weights
    if weights is None:
        weights = [torch.randn(o.shape, generator=gen) if o.is_floating_point() else None for o in outputs]
    terms = [(o * w.to(o.device, o.dtype)).sum() for o, w in zip(outputs, weights)
             if w is not None and o.requires_grad and o.is_floating_point()]
    wanted = [t for t in leaves if t.requires_grad]
    grads = []
    if terms and wanted:
        grads = torch.autograd.grad(sum(terms), wanted, allow_unused=True)
    return [o.detach() for o in outputs], list(grads), weights

