"""mydev program texts (csrc/compiler/Graph.h) for the fuzzer: mutations of a text, and a reference that runs
a text op by op on the CPU, so that what a mutated program computes can be checked.

The reference is deliberately simple: each line's ATen operator called through torch.ops on CPU tensors, with
the text's arguments; no fusion, no memory plan. Where the compiler builds and runs a text, the reference must
agree, or the program's text said something its ops do not do (then the compiler should have refused it).
"""
import random
import re

import torch

# c10::ScalarType by name (the text's t"Float") and by number (an integer dtype argument).
DTYPES = {
    "Byte": torch.uint8, "Char": torch.int8, "Short": torch.int16, "Int": torch.int32, "Long": torch.int64,
    "Half": torch.float16, "Float": torch.float32, "Double": torch.float64, "ComplexHalf": torch.complex32,
    "ComplexFloat": torch.complex64, "ComplexDouble": torch.complex128, "Bool": torch.bool,
    "BFloat16": torch.bfloat16,
}
_SCALAR_TYPE_NUMBERS = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64,
                        5: torch.float16, 6: torch.float32, 7: torch.float64, 8: torch.complex32,
                        9: torch.complex64, 10: torch.complex128, 11: torch.bool, 15: torch.bfloat16}
_LAYOUTS = {0: torch.strided, 1: torch.sparse_coo, 2: torch.sparse_csr}
_MEMORY_FORMATS = {0: torch.contiguous_format, 1: torch.preserve_format, 2: torch.channels_last,
                   3: torch.channels_last_3d}

_GEOMETRY = re.compile(r"(\w+)\[([-\d,]*)\]\{([-\d,]*)\}\+(-?\d+)")


class Geometry:
    __slots__ = ("dtype", "sizes", "strides", "offset")

    def __init__(self, text):
        m = _GEOMETRY.fullmatch(text.strip())
        if m is None or m.group(1) not in DTYPES:
            raise ValueError(f"not a geometry: {text!r}")
        ints = lambda s: [int(x) for x in s.split(",")] if s else []  # noqa: E731
        self.dtype = DTYPES[m.group(1)]
        self.sizes, self.strides, self.offset = ints(m.group(2)), ints(m.group(3)), int(m.group(4))

    def storage_elements(self):
        if any(s == 0 for s in self.sizes):
            return self.offset
        return self.offset + 1 + sum((s - 1) * st for s, st in zip(self.sizes, self.strides))

    def tensor(self, device, gen):
        """A tensor of this geometry, its storage holding random numbers (small ones for integers: indices)."""
        n = max(self.storage_elements(), 1)
        if self.dtype == torch.bool:
            flat = torch.rand(n, generator=gen) < 0.5
        elif self.dtype.is_floating_point or self.dtype.is_complex:
            flat = torch.randn(n, generator=gen).to(self.dtype)
        else:
            flat = torch.randint(0, 3, (n,), generator=gen).to(self.dtype)
        return flat.to(device).as_strided(self.sizes, self.strides, self.offset)


class _Ref:
    __slots__ = ("id",)

    def __init__(self, i):
        self.id = i


class _Reader:
    """Arguments of one call: %N, n, i<int>, f<double>, b0/b1, s"..", d"..", t"..", [..]."""

    def __init__(self, text):
        self.s, self.i = text, 0

    def skip(self):
        while self.i < len(self.s) and self.s[self.i] in " ,":
            self.i += 1

    def quoted(self):
        assert self.s[self.i] == '"'
        j, out = self.i + 1, []
        while self.s[j] != '"':
            if self.s[j] == "\\":
                j += 1
            out.append(self.s[j])
            j += 1
        self.i = j + 1
        return "".join(out)

    def arg(self):
        self.skip()
        c = self.s[self.i]
        if c == "[":
            self.i += 1
            items = []
            while True:
                self.skip()
                if self.s[self.i] == "]":
                    self.i += 1
                    return items
                items.append(self.arg())
        if c in "sdt" and self.s[self.i + 1] == '"':
            self.i += 1
            text = self.quoted()
            return {"s": text, "d": torch.device("cpu"), "t": DTYPES.get(text)}[c]
        m = re.compile(r"%\d+|n|_|i-?\d+|b-?\d+|f[^,\])\s]+").match(self.s, self.i)
        if m is None:
            raise ValueError(f"cannot read an argument at {self.s[self.i:self.i + 20]!r}")
        self.i = m.end()
        tok = m.group(0)
        if tok[0] == "%":
            return _Ref(int(tok[1:]))
        if tok in ("n", "_"):
            return None
        if tok[0] == "i":
            return int(tok[1:])
        if tok[0] == "b":
            return tok != "b0"
        return float(tok[1:])

    def args(self):
        out = []
        while True:
            self.skip()
            if self.s[self.i] == ")":
                return out
            out.append(self.arg())


def _operator(name):
    namespace, _, rest = name.partition("::")
    op, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")


def _typed(value, arg_type):
    """An integer where the schema wants a dtype, layout or memory format, as the dispatcher passes them; a
    number where it wants a tensor as a 0-dim tensor (the compiler makes it a wrapped number)."""
    kind = str(arg_type)
    if kind in ("Tensor", "Optional[Tensor]") and isinstance(value, (bool, int, float)):
        return torch.tensor(value)
    if isinstance(value, int) and not isinstance(value, bool):
        for name, table in (("ScalarType", _SCALAR_TYPE_NUMBERS), ("Layout", _LAYOUTS),
                            ("MemoryFormat", _MEMORY_FORMATS)):
            if name in kind:
                return table[value]
    return value


def run_reference(text, inputs):
    """Runs the program `text` op by op on the CPU with `inputs` (CPU tensors of the input lines' geometry).
    Returns the outputs; raises ValueError where a line's result is not the geometry the text gives it."""
    values = {}
    outputs = []
    inputs = iter(inputs)
    needed = _needed_lines(text)
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("program"):
            continue
        if line.startswith("input "):
            values[int(line.split()[1][1:])] = next(inputs)
            continue
        if line.startswith("output"):
            outputs = [values[int(t[1:])] for t in line.split()[1:]]
            continue
        if number not in needed:
            continue
        lhs, _, rest = line.partition(" = ")
        name, _, call = rest.partition("(")
        reader = _Reader(call)
        args = reader.args()
        geometry = call[reader.i + 1:].split(" @ ")[0].lstrip(" :")
        op = _operator(name)
        resolve = lambda a: values[a.id] if isinstance(a, _Ref) else [resolve(x) for x in a] if isinstance(a, list) else a  # noqa: E731,E501
        schema = op._schema.arguments
        if len(args) != len(schema):
            raise ValueError(f"line {number}: {name} takes {len(schema)} arguments, the text gives {len(args)}")
        positional = [_typed(resolve(a), s.type) for a, s in zip(args, schema) if not s.kwarg_only]
        keywords = {s.name: _typed(resolve(a), s.type) for a, s in zip(args, schema) if s.kwarg_only}
        result = op(*positional, **keywords)
        if name.startswith(("aten::empty", "aten::new_empty")) and result.is_floating_point():
            result.fill_(float("nan"))  # what the program leaves unwritten is not compared (compare())
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        for r, (out, geo, got) in enumerate(zip(lhs.split(", "), geometry.split(", "), results)):
            if out == "_":
                continue
            want = Geometry(geo)
            # A second result may be empty on one side (the CPU's native_batch_norm's saved statistics outside
            # training, which meta kernels size): the compiler allows it too.
            empty = r > 0 and (got.numel() == 0 or 0 in want.sizes)
            if isinstance(got, torch.Tensor) and (got.dtype != want.dtype or (list(got.shape) != want.sizes
                                                                               and not empty)):
                raise ValueError(f"line {number}: {name} gives {got.dtype}{list(got.shape)}, the text says {geo}")
            if empty and 0 in want.sizes:
                got = got.new_empty(want.sizes)  # what the compiler keeps of it, too
            values[int(out[1:])] = got
    return outputs


# Ops that update running statistics their schemas do not mark as written (as the compiler's mutates()).
_WRITES_RUNNING_STATS = {"batch_norm", "instance_norm", "native_batch_norm", "batch_norm_update_stats"}


def _needed_lines(text):
    """The numbers of the lines whose results the outputs depend on, and of those that write an argument: a
    compiler drops the others, with any error their ops would raise (so does Inductor)."""
    lines = text.splitlines()
    producer = {}
    for number, line in enumerate(lines, 1):
        if line.startswith("%"):
            for out in line.split(" = ")[0].split(", "):
                if out != "_":
                    producer[out] = number
    wanted = [t for line in lines if line.startswith("output") for t in line.split()[1:]]
    needed = set()
    for number, line in enumerate(lines, 1):
        op = line.partition(" = ")[2].partition("(")[0].split("::")[-1]
        if line.startswith("%") and (op.split(".")[0].endswith("_") or op.split(".")[0] in _WRITES_RUNNING_STATS):
            wanted += re.findall(r"%\d+", line.partition("(")[2].split(" : ")[0])
            needed.add(number)
    while wanted:
        number = producer.get(wanted.pop())
        if number is not None and number not in needed:
            needed.add(number)
            wanted += re.findall(r"%\d+", lines[number - 1].partition("(")[2].split(" : ")[0])
    return needed


def compare(got, want, **tolerance):
    """Raises AssertionError unless `got` (the compiled program's outputs) agrees with `want` (run_reference's)
    wherever the reference is not NaN: memory a program leaves unwritten (torch.empty) holds NaN there."""
    for g, w in zip(got, want):
        if g.shape != w.shape or g.dtype != w.dtype:
            raise AssertionError(f"{g.dtype}{list(g.shape)} against {w.dtype}{list(w.shape)}")
        if w.is_floating_point():
            known = ~torch.isnan(w)
            g, w = g[known], w[known]
        torch.testing.assert_close(g, w, check_stride=False, **tolerance)


def input_geometries(text):
    return [Geometry(line.split(":", 1)[1]) for line in text.splitlines() if line.startswith("input ")]


# --- mutations: each changes one place of a text, as a damaged file or a bad frontend would.

def _numbers(line):
    return [m for m in re.finditer(r"-?\d+", line)]


def _replace_span(s, span, new):
    return s[:span[0]] + new + s[span[1]:]


def _mutate_number(lines, rng):
    i = rng.randrange(len(lines))
    found = _numbers(lines[i])
    if not found:
        return None
    m = rng.choice(found)
    n = int(m.group(0))
    new = rng.choice([0, 1, -1, n + 1, n - 1, 2 * n, n + 1000, 1 << 31, 1 << 62])
    lines[i] = _replace_span(lines[i], m.span(), str(new))
    return lines


def _mutate_dtype(lines, rng):
    i = rng.randrange(len(lines))
    found = list(re.finditer("|".join(sorted(DTYPES, key=len, reverse=True)), lines[i]))
    if not found:
        return None
    m = rng.choice(found)
    lines[i] = _replace_span(lines[i], m.span(), rng.choice(list(DTYPES)))
    return lines


def _mutate_value(lines, rng):
    i = rng.randrange(len(lines))
    found = list(re.finditer(r"%\d+", lines[i]))
    if not found:
        return None
    m = rng.choice(found)
    lines[i] = _replace_span(lines[i], m.span(), f"%{rng.randrange(len(lines) + 2)}")
    return lines


def _mutate_operator(lines, rng):
    calls = [i for i, line in enumerate(lines) if "aten::" in line]
    if len(calls) < 2:
        return None
    a, b = rng.sample(calls, 2)
    op_b = re.search(r"aten::[\w.]+", lines[b]).group(0)
    lines[a] = re.sub(r"aten::[\w.]+", op_b, lines[a], count=1)
    return lines


def _mutate_argument(lines, rng):
    calls = [i for i, line in enumerate(lines) if "(" in line]
    if not calls:
        return None
    i = rng.choice(calls)
    head, _, tail = lines[i].partition("(")
    parts = tail.split(", ")
    k = rng.randrange(len(parts))
    if rng.random() < 0.5 and len(parts) > 1:
        del parts[k]
    else:
        parts.insert(k, parts[k].rstrip(")").split(")")[0] or "n")
    lines[i] = head + "(" + ", ".join(parts)
    return lines


def _mutate_lines(lines, rng):
    if len(lines) < 3:
        return None
    i, j = rng.randrange(1, len(lines)), rng.randrange(1, len(lines))
    kind = rng.choice(["drop", "duplicate", "swap"])
    if kind == "drop":
        del lines[i]
    elif kind == "duplicate":
        lines.insert(j, lines[i])
    else:
        lines[i], lines[j] = lines[j], lines[i]
    return lines


def _truncate(lines, rng):
    text = "\n".join(lines)
    return text[:rng.randrange(len(text))].split("\n")


MUTATIONS = (_mutate_number, _mutate_number, _mutate_number, _mutate_dtype, _mutate_value, _mutate_operator,
             _mutate_argument, _mutate_lines, _truncate)


def mutate(text, rng: random.Random):
    """`text` changed in one place (a number, a dtype, a value, an operator, an argument, a line, its end)."""
    for _ in range(20):
        lines = text.splitlines()
        changed = rng.choice(MUTATIONS)(lines, rng)
        if changed is not None:
            mutated = "\n".join(changed) + "\n"
            if mutated != text:
                return mutated
    return text
