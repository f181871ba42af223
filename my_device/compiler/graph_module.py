"""One FX graph compiled for mydev: the callable aot_autograd's compilers return.

Static graphs are lowered once. A graph with symbolic sizes (torch.compile(dynamic=True)) is lowered
per concrete input geometry the first time it is seen, with FakeTensor propagation giving that
geometry's metadata: Dynamo still compiles the frame once, and the program cache keeps one program
per size. A graph the program cannot express runs eagerly (its ops are ordinary mydev kernels), with
a warning naming the reason, counted in my_device.compiler.counters()["graphs_eager"].
"""
import itertools
import operator
import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from .. import _C
from .lowering import Unsupported, lower

_names = itertools.count()
_stats = {"graphs_eager": 0, "specializations": 0}


def _is_symbolic(val):
    if isinstance(val, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride(), val.storage_offset()))
    return isinstance(val, (torch.SymInt, torch.SymFloat))


class _Lowered:
    __slots__ = ("program", "positions", "constants", "results")

    def __init__(self, gm, name):
        text, self.positions, self.constants, self.results = lower(gm, name)
        self.program = _C._compiler.compile(text)

    def __call__(self, args):
        inputs = [args[i] for i in self.positions]
        inputs.extend(self.constants)
        outs = iter(self.program.run(inputs))
        return [next(outs) if kind == "value" else v for kind, v in self.results]


def _is_host_value(val):
    if isinstance(val, (list, tuple)):
        return len(val) > 0 and all(_is_host_value(v) for v in val)
    return isinstance(val, torch.Tensor) and val.device.type == "cpu"


def split_host_prologue(gm):
    """Splits off the ops that compute on CPU tensors only, which the host must run at the call.

    An optimizer compiled with capturable=False keeps its step counts on the CPU: the graph
    increments them and derives bias corrections from them, which mydev kernels then read as
    scalars. Run inside a queued program those CPU ops would finish later than the host expects
    (it may read a step count right after the call). So they form a prologue the host runs first;
    its results that the rest reads become the program's extra inputs, 0-dim CPU tensors the
    launch copies. Returns (prologue, rest), or None when there is nothing to split off or an op
    on CPU tensors reads a device tensor (that needs the device's result: the graph runs eagerly).
    """
    nodes = list(gm.graph.nodes)
    host = set()
    for node in nodes:
        if node.op == "placeholder":
            if _is_host_value(node.meta.get("val")):
                host.add(node)
        elif node.op == "call_function" and _is_host_value(node.meta.get("val")):
            if not all(a in host for a in node.all_input_nodes):
                return None
            host.add(node)
    computed = [n for n in nodes if n in host and n.op != "placeholder"]
    if not computed:
        return None
    # Host values the rest of the graph reads (a getitem of a host node is itself a host node).
    exported = [n for n in computed if any(u not in host for u in n.users)]
    placeholders = [n for n in nodes if n.op == "placeholder"]

    prologue = torch.fx.Graph()
    env = {}
    for n in placeholders:
        env[n] = prologue.node_copy(n)
    for n in computed:
        env[n] = prologue.node_copy(n, lambda a: env[a])
    prologue.output(tuple(env[n] for n in exported))

    rest = torch.fx.Graph()
    env = {}
    for n in placeholders:
        env[n] = rest.node_copy(n)
    for n in exported:
        p = rest.placeholder(f"host_{n.name}")
        p.meta = dict(n.meta)
        env[n] = p
    for n in nodes:
        if n.op == "placeholder" or n in host:
            continue
        env[n] = rest.node_copy(n, lambda a: env[a])
    return torch.fx.GraphModule(gm, prologue), torch.fx.GraphModule(gm, rest)


_LIKE_FACTORIES = ("full_like", "zeros_like", "ones_like", "empty_like")


def _rebuilt(gm, changed):
    """gm, linted and recompiled if a pass changed its graph."""
    if changed:
        gm.graph.lint()
        gm.recompile()
    return gm


def _joins_chain(node, producer):
    """Whether `node`, a user of `producer`, may be scheduled right after it: a pure pointwise op (or
    a *_like factory) of the producer's shape."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if torch.Tag.pointwise not in node.target.tags and node.target._opname not in _LIKE_FACTORIES:
        return False
    a, b = node.meta.get("val"), producer.meta.get("val")
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape


def _scalar_fill(node):
    """The number a `full_like(x, number)` of a floating dtype fills with, else None."""
    if node.op != "call_function" or node.target is not torch.ops.aten.full_like.default:
        return None
    if len(node.args) != 2 or any(v is not None and not (k == "pin_memory" and v is False)
                                  for k, v in node.kwargs.items()):
        return None
    value, val = node.args[1], node.meta.get("val")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not isinstance(val, torch.Tensor):
        return None
    return value if val.dtype.is_floating_point else None


def _scalar_tensor(node):
    """The number of a 0-dim `scalar_tensor(number)` of a floating dtype (the backward of relu and of
    threshold: `where(x <= 0, scalar_tensor(0), grad)`), else None. A 0-dim operand keeps a fused kernel
    off its one-pass path, and the call that makes it costs more than the kernel's arithmetic."""
    if node.op != "call_function" or node.target is not torch.ops.aten.scalar_tensor.default or len(node.args) != 1:
        return None
    value, val = node.args[0], node.meta.get("val")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not isinstance(val, torch.Tensor):
        return None
    return value if val.dtype.is_floating_point and val.dim() == 0 else None


def fold_scalar_fills(gm):
    """Replaces `full_like(x, c)` and `scalar_tensor(c)` read only by pointwise ops with the number c itself.

    Decompositions turn a number operand into a filled tensor (the optimizers' lerp becomes
    `addcmul(exp_avg, full_like(diff, 1 - beta1), diff)`); the fill is a call that splits the
    chain around it, while a number is a constant of the fused kernel. Only where the result is
    the same: the fill has x's dtype (as a number operand of a tensor op of that dtype gives), and
    each user has another operand of its own output's shape, so broadcasting is unchanged.
    """
    changed = False
    # A pointwise op of a fill and numbers only (addcmul's `value` applied to it) is a fill itself.
    folding = True
    while folding:
        folding = False
        for node in list(gm.graph.nodes):
            if _scalar_fill(node) is None:
                continue
            for user in list(node.users):
                out = user.meta.get("val")
                if (user.op != "call_function" or not isinstance(user.target, torch._ops.OpOverload)
                        or torch.Tag.pointwise not in user.target.tags or not isinstance(out, torch.Tensor)
                        or out.dtype != node.meta["val"].dtype or out.shape != node.meta["val"].shape
                        or any(isinstance(a, torch.fx.Node) and a is not node
                               for a in (*user.args, *user.kwargs.values()))):
                    continue
                one = torch.tensor(node.args[1], dtype=out.dtype)
                value = user.target(*[one if a is node else a for a in user.args], **user.kwargs).item()
                with gm.graph.inserting_before(user):
                    fill = gm.graph.call_function(torch.ops.aten.full_like.default, (node.args[0], value),
                                                  dict(node.kwargs))
                fill.meta = dict(user.meta)
                user.replace_all_uses_with(fill)
                gm.graph.erase_node(user)
                folding = changed = True
            if not node.users:
                gm.graph.erase_node(node)
    for node in list(gm.graph.nodes):
        value = _scalar_fill(node)
        if value is None:
            value = _scalar_tensor(node)
        if value is None:
            continue

        def keeps_shape(user):
            out = user.meta.get("val")
            return (user.op == "call_function" and isinstance(user.target, torch._ops.OpOverload)
                    and torch.Tag.pointwise in user.target.tags and isinstance(out, torch.Tensor)
                    and any(a is not node and isinstance(a, torch.fx.Node)
                            and isinstance(a.meta.get("val"), torch.Tensor)
                            and a.meta["val"].shape == out.shape for a in user.args))

        if not node.users or not all(keeps_shape(u) for u in node.users):
            continue
        node.replace_all_uses_with(float(value))
        gm.graph.erase_node(node)
        changed = True
    return _rebuilt(gm, changed)


_SELECT_BACKWARD = torch.ops.aten.select_backward.default
_ADD = torch.ops.aten.add.Tensor


def _select_backward_terms(node, root):
    """The select_backward nodes that a tree of additions rooted at `root` sums, each read by that tree
    only (the root aside), else None."""
    if node.op != "call_function" or (node is not root and len(node.users) != 1):
        return None
    if node.target is _SELECT_BACKWARD:
        return [node]
    if node.target is not _ADD or len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1:
        return None
    terms = [_select_backward_terms(a, root) if isinstance(a, torch.fx.Node) else None for a in node.args]
    return None if None in terms else terms[0] + terms[1]


def stack_select_backward_sums(gm):
    """Replaces a sum of `select_backward`s that fill every index of one dim once by one `cat`.

    The backward of taking a tensor apart along a dim (nn.MultiheadAttention's packed projection,
    `proj[0], proj[1], proj[2]`) writes each part's gradient into zeros of the whole shape and adds
    the results: n fills, n copies and n - 1 additions of the whole tensor, where putting the parts
    side by side is one copy. The values are the same (each element is one gradient's plus zeros),
    but for a -0.0 gradient, which the additions make +0.0.
    """
    changed = False
    for node in reversed(list(gm.graph.nodes)):
        if node.op != "call_function" or node.target is not _ADD or getattr(node, "_erased", False):
            continue
        terms = _select_backward_terms(node, node)
        if not terms:
            continue
        sizes, dim = terms[0].args[1], terms[0].args[2]
        dim = dim % len(sizes)
        out = node.meta.get("val")
        if (any(t.args[1] != sizes or t.args[2] % len(sizes) != dim for t in terms)
                or not isinstance(out, torch.Tensor)
                or any(t.meta.get("val") is None or t.meta["val"].dtype != out.dtype for t in terms)):
            continue
        by_index = {t.args[3] % sizes[dim]: t for t in terms}
        if sorted(by_index) != list(range(sizes[dim])) or len(terms) != sizes[dim]:
            continue
        parts = []
        with gm.graph.inserting_before(node):
            for i in range(sizes[dim]):
                grad = by_index[i].args[0]
                part = gm.graph.call_function(torch.ops.aten.unsqueeze.default, (grad, dim))
                part.meta["val"] = torch.ops.aten.unsqueeze.default(grad.meta["val"], dim)
                parts.append(part)
            whole = gm.graph.call_function(torch.ops.aten.cat.default, (parts, dim))
            whole.meta["val"] = torch.ops.aten.cat.default([p.meta["val"] for p in parts], dim)
        node.replace_all_uses_with(whole)
        gm.graph.eliminate_dead_code()
        changed = True
    return _rebuilt(gm, changed)


def cluster_pointwise_chains(gm):
    """Reorders a functional graph so that each chain of pointwise ops over one shape is contiguous.

    The compiler fuses runs of consecutive pointwise ops of one shape. Graphs traced from list ops
    (an optimizer's `_foreach_*` calls, decomposed per tensor) interleave the chains of different
    parameters, op by op, so no two neighbours could fuse. Here an op that continues a chain is
    scheduled right after the last of its inputs, and a pointwise op that reads graph inputs only
    (a chain's head, `exp_avg_sq * beta2`) waits until the chain it starts is scheduled. Graphs
    with mutations keep their order.
    """
    nodes = list(gm.graph.nodes)
    if any(n.op == "call_function" and n.is_impure() for n in nodes):
        return gm
    floating = {n for n in nodes if n.op == "call_function" and n.all_input_nodes and len(n.users) == 1
                and all(i.op in ("placeholder", "get_attr") for i in n.all_input_nodes)
                and _joins_chain(n, n)}
    emitted, order = set(), []

    def emit(n):
        stack = [n]
        while stack:
            x = stack.pop()
            if x in emitted:
                continue
            pulled = [i for i in x.all_input_nodes if i not in emitted]
            if pulled:  # floating heads this op reads: they go first
                stack.append(x)
                stack.extend(pulled)
                continue
            emitted.add(x)
            order.append(x)
            if x.op == "placeholder":
                continue
            ready = [u for u in x.users if u not in emitted and u not in floating and _joins_chain(u, x)
                     and all(i in emitted or i in floating for i in u.all_input_nodes)]
            stack.extend(reversed(ready))

    for n in nodes:
        if n.op == "placeholder":
            emit(n)
    for n in nodes:
        if n.op != "output" and n not in emitted and n not in floating:
            emit(n)
    for n in nodes:
        if n.op != "output" and n not in emitted:
            emit(n)
    if order == nodes[:-1]:
        return gm
    output = nodes[-1]
    for n in order:
        output.prepend(n)
    gm.graph.lint()
    gm.recompile()
    return gm


_EVAL_BATCH_NORM = torch.ops.aten._native_batch_norm_legit_no_training.default


def fresh_eval_batch_norm_statistics(gm):
    """Gives the saved statistics of batch norm in eval mode (`_native_batch_norm_legit_no_training`'s
    second and third results) fresh tensors of the graph's geometry.

    Nothing reads their values (batch norm's backward takes the running statistics in eval mode), but
    the traced graph gives them the channel count's size (the Meta kernel's, as CUDA's kernel does),
    while the CPU kernel a program runs gives them no elements: the program could not fill the
    outputs the graph promised (BatchNorm and InstanceNorm in eval mode failed to run compiled).
    """
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _EVAL_BATCH_NORM:
            continue
        for user in list(node.users):
            val = user.meta.get("val")
            if (user.op != "call_function" or user.target is not operator.getitem or user.args[1] not in (1, 2)
                    or not isinstance(val, torch.Tensor)):
                continue
            with gm.graph.inserting_after(user):
                fresh = gm.graph.call_function(torch.ops.aten.empty_strided.default,
                                               (list(val.shape), list(val.stride())),
                                               {"dtype": val.dtype, "device": val.device})
            fresh.meta = dict(user.meta)
            user.replace_all_uses_with(fresh)
            gm.graph.erase_node(user)
            changed = True
    return _rebuilt(gm, changed)


_aten = torch.ops.aten
_CLONE = _aten.clone.default
_MM = _aten.mm.default
_VIEW = _aten.view.default


def _mutates(nodes):
    """Whether any of the graph's nodes writes memory (an in-place or out= op)."""
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
               for n in nodes)


def _returns_alias(node):
    """Whether `node`'s result may share its first argument's memory (a view op, an in-place op)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return node.op == "call_function" and node.target is operator.getitem
    returns = node.target._schema.returns
    return any(r.alias_info is not None for r in returns)


def _alias_root(node):
    """The node whose memory `node` reads: through views back to what made the memory."""
    while _returns_alias(node) and node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def _returned_only_as_saved(node):
    """Whether every way the graph returns `node` or a view of it is as a tensor aot_autograd saves for the
    backward (which only reads it), not as a result its caller may change."""
    stack, seen = [node], set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        for u in x.users:
            if u.op == "output":
                descs = u.meta.get("desc")
                outputs = u.args[0] if isinstance(u.args[0], (list, tuple)) else [u.args[0]]
                if descs is None or len(descs) != len(outputs):
                    return False
                if any(o is x and type(d).__name__ != "SavedForBackwardsAOTOutput" for o, d in zip(outputs, descs)):
                    return False
            elif _returns_alias(u):
                stack.append(u)
    return True


def elide_layout_preserving_clones(gm):
    """Replaces a `clone` whose result has its input's layout, and that the graph neither returns nor
    mutates, with its input.

    In a functional graph a clone that is only read is a copy nobody can tell from its source:
    training-mode dropout with p=0 traces as one, and nn.TransformerEncoderLayer(dropout=0.0) has three
    in its forward, each a pass over an activation. Returned, the two may share memory only as tensors
    saved for the backward, of memory the graph made: a result its caller may change in place, or a
    graph input, must stay apart from a saved tensor. A graph that mutates keeps every clone.
    """
    nodes = list(gm.graph.nodes)
    if _mutates(nodes):
        return gm
    changed = False
    for node in nodes:
        if node.op != "call_function" or node.target is not _CLONE or not isinstance(node.args[0], torch.fx.Node):
            continue
        src, val = node.args[0].meta.get("val"), node.meta.get("val")
        if (not isinstance(src, torch.Tensor) or not isinstance(val, torch.Tensor) or src.dtype != val.dtype
                or src.shape != val.shape or src.stride() != val.stride()
                or not torch._prims_common.is_non_overlapping_and_dense_or_false(src)):
            continue
        root = _alias_root(node.args[0])
        if root.op in ("placeholder", "get_attr") or not (_returned_only_as_saved(node) and _returned_only_as_saved(root)):
            continue
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
        changed = True
    return _rebuilt(gm, changed)


def fold_bias_into_products(gm):
    """Rewrites `add(view(mm(a, b)), bias)` (and `add(mm(a, b), bias)`), bias one value per column, as
    `view(addmm(bias, a, b))`.

    Decomposing `linear` over a batch of sequences leaves the product and its bias apart: a product and
    then a pass over its result, where the CPU's eager `linear` makes one `addmm` call that starts from
    the bias. Only where nothing else reads the product or its view.
    """
    changed = False
    for node in list(gm.graph.nodes):
        if (node.op != "call_function" or node.target is not _ADD or len(node.args) != 2
                or node.kwargs.get("alpha", 1) != 1):
            continue
        x, bias = node.args
        if not isinstance(x, torch.fx.Node) or not isinstance(bias, torch.fx.Node) or len(x.users) != 1:
            continue
        view = None
        if x.op == "call_function" and x.target is _VIEW and isinstance(x.args[0], torch.fx.Node):
            view, x = x, x.args[0]
            if len(x.users) != 1:
                continue
        if x.op != "call_function" or x.target is not _MM:
            continue
        prod, b, out = x.meta.get("val"), bias.meta.get("val"), node.meta.get("val")
        if (not isinstance(prod, torch.Tensor) or not isinstance(b, torch.Tensor) or not isinstance(out, torch.Tensor)
                or b.dim() != 1 or b.shape[0] != prod.shape[1] or b.dtype != prod.dtype or out.dtype != prod.dtype
                or out.shape != (prod.shape if view is None else view.meta["val"].shape)
                or out.shape[-1] != prod.shape[1]):
            continue
        with gm.graph.inserting_before(node):
            fused = gm.graph.call_function(_aten.addmm.default, (bias, *x.args))
            fused.meta["val"] = _aten.addmm.default(b, *(a.meta["val"] for a in x.args))
            result = fused
            if view is not None:
                result = gm.graph.call_function(_VIEW, (fused, view.args[1]))
                result.meta["val"] = _VIEW(fused.meta["val"], view.args[1])
        node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
        if view is not None:
            gm.graph.erase_node(view)
        gm.graph.erase_node(x)
        changed = True
    return _rebuilt(gm, changed)


# Ops each of whose result elements is one element of an argument, moved: chains of them are data movement.
_MOVES = {_aten.clone.default, _aten.view.default, _aten._unsafe_view.default, _aten.permute.default,
          _aten.transpose.int, _aten.t.default, _aten.unsqueeze.default, _aten.squeeze.dim, _aten.squeeze.dims,
          _aten.squeeze.default, _aten.cat.default, _aten.alias.default, _aten.select.int, _aten.slice.Tensor}
_COPIES = {_aten.clone.default, _aten.cat.default}
_MAX_TRACED_MOVE = 1 << 24


def _affine(offsets):
    """(offset, strides) with offsets[i] == offset + sum(i_d * strides[d]) everywhere, else None."""
    origin = int(offsets.flatten()[0])
    strides = []
    for d, size in enumerate(offsets.shape):
        strides.append(int(offsets.select(d, 1).flatten()[0]) - origin if size > 1 else 0)
    if any(st < 0 for st in strides):
        return None
    expected = torch.arange(origin + 1 + sum((n - 1) * st for n, st in zip(offsets.shape, strides)))
    if not torch.equal(expected.as_strided(offsets.shape, strides, origin), offsets):
        return None
    return origin, strides


def _moved_from(sources, nodes, last):
    """Where each element of `last`'s result comes from, `nodes` (data movement only) run on the memory
    offsets of `sources`: (source index, offset) tensors of the result's shape."""
    extent = [s.storage_offset() + 1 + sum((n - 1) * st for n, st in zip(s.shape, s.stride())) for s in sources.values()]
    big = max(extent)
    env = {}
    for j, (node, s) in enumerate(sources.items()):
        env[node] = torch.arange(extent[j]).as_strided(s.shape, s.stride(), s.storage_offset()) + j * big
    for n in nodes:
        args = torch.fx.map_arg(n.args, lambda a: env[a])
        kwargs = torch.fx.map_arg(n.kwargs, lambda a: env[a])
        env[n] = n.target(*args, **kwargs)
    return env[last] // big, env[last] % big


def collapse_data_movement(gm):
    """Rewrites a chain of copies and views (clones, reshapes, permutes, a cat) that only rearranges its
    sources' elements as one pass: each source read through one strided view, and one clone or cat.

    The backward of nn.MultiheadAttention's packed projection moves each of attention's three gradients
    through two contiguous clones, a cat and a last clone before the weight's gradient reads them: four
    passes over the activations where one does. Runs the chain on the sources' memory offsets to find
    where each result element comes from; only where each source's share is one strided view of it, and
    each source is made by the graph.
    """
    nodes = list(gm.graph.nodes)
    if _mutates(nodes):
        return gm
    changed = False
    for last in reversed(nodes):
        if getattr(last, "_erased", False) or last.op != "call_function" or last.target not in _COPIES:
            continue
        val = last.meta.get("val")
        # (the offsets are int64 tensors as large as the chain's: a bound on what compiling allocates)
        if not isinstance(val, torch.Tensor) or not val.is_contiguous() or not 0 < val.numel() <= _MAX_TRACED_MOVE:
            continue
        chain, sources, stack = {last}, {}, [last]
        while stack:
            for a in stack.pop().all_input_nodes:
                if a in chain or a in sources:
                    continue
                if a.op == "call_function" and a.target in _MOVES and all(u in chain for u in a.users):
                    chain.add(a)
                    stack.append(a)
                elif (a.op not in ("placeholder", "get_attr") and isinstance(a.meta.get("val"), torch.Tensor)
                      and a.meta["val"].dtype == val.dtype):
                    # (as_strided reads from the storage's start: an input's offset there is the caller's)
                    sources[a] = a.meta["val"]
                else:
                    sources = None
                    break
            if sources is None:
                break
        if sources is None or sum(n.target in _COPIES for n in chain) < 2:
            continue
        ordered = [n for n in nodes if n in chain]
        with unset_fake_temporarily():  # the offsets are real tensors, whatever mode the compiler runs under
            found = _pieces(*_moved_from(sources, ordered, last))
        if found is None:
            continue
        dim, pieces = found
        inputs = list(sources)
        with gm.graph.inserting_before(last):
            views = []
            for j, shape, strides, origin in pieces:
                view = gm.graph.call_function(_aten.as_strided.default, (inputs[j], shape, strides, origin))
                view.meta["val"] = _aten.as_strided.default(sources[inputs[j]], shape, strides, origin)
                views.append(view)
            if len(views) == 1:
                result = gm.graph.call_function(_CLONE, (views[0],), {"memory_format": torch.contiguous_format})
                result.meta["val"] = _CLONE(views[0].meta["val"], memory_format=torch.contiguous_format)
            else:
                result = gm.graph.call_function(_aten.cat.default, (views, dim))
                result.meta["val"] = _aten.cat.default([v.meta["val"] for v in views], dim)
        last.replace_all_uses_with(result)
        for n in reversed(ordered):
            gm.graph.erase_node(n)
        nodes = list(gm.graph.nodes)
        changed = True
    return _rebuilt(gm, changed)


def _pieces(which, offsets):
    """The result as runs along one dim, each one strided view of one source: (dim, [(source, shape,
    strides, offset)]), else None."""
    if int(which.min()) == int(which.max()):
        found = _affine(offsets)
        return None if found is None else (0, [(int(which.flatten()[0]), list(offsets.shape), found[1], found[0])])
    for dim in range(which.dim()):
        others = [d for d in range(which.dim()) if d != dim]
        along = which.amax(dim=others) if others else which
        if others and not torch.equal(along, which.amin(dim=others)):
            continue
        pieces, start = [], 0
        for i in range(1, which.shape[dim] + 1):
            if i < which.shape[dim] and int(along[i]) == int(along[start]):
                continue
            found = _affine(offsets.narrow(dim, start, i - start))
            if found is None:
                return None
            pieces.append((int(along[start]), list(offsets.narrow(dim, start, i - start).shape), found[1], found[0]))
            start = i
        return dim, pieces
    return None


# In this order: the later passes see the graphs the earlier ones leave.
_PASSES = (fresh_eval_batch_norm_statistics, fold_scalar_fills, stack_select_backward_sums, elide_layout_preserving_clones,
           fold_bias_into_products, collapse_data_movement, cluster_pointwise_chains)


class CompiledGraph:
    """The boxed callable for one FX graph (aot_autograd's forward, backward or inference graph)."""

    def __init__(self, gm, kind):
        self.gm = gm
        self.name = f"mydev_{kind}_{next(_names)}"
        self.dynamic = any(_is_symbolic(n.meta.get("val")) for n in gm.graph.nodes)
        self.programs = {}
        self.eager = None
        self.lowered = None
        self.prologue = None
        if not self.dynamic:
            split = split_host_prologue(gm)
            if split is not None:
                self.prologue, gm = split
            for graph_pass in _PASSES:
                gm = graph_pass(gm)
            self.lowered = self._lower(gm)
            if self.lowered is None:
                self.prologue = None  # the whole original graph runs eagerly

    def _lower(self, gm):
        try:
            return _Lowered(gm, self.name)
        except (Unsupported, RuntimeError) as e:
            _stats["graphs_eager"] += 1
            warnings.warn(f"mydev compiler: graph {self.name} runs eagerly: {e}", stacklevel=3)
            self.eager = gm
            return None

    def _specialize(self, args):
        key = tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        lowered = self.programs.get(key)
        if lowered is None and key not in self.programs:
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            fakes = [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]
            FakeTensorProp(self.gm, mode).propagate_dont_convert_inputs(*fakes)
            _stats["specializations"] += 1
            lowered = self.programs[key] = self._lower(self.gm)
        return lowered

    def __call__(self, args):
        lowered = self._specialize(args) if self.dynamic else self.lowered
        if lowered is None:
            out = self.gm(*args)
        else:
            inputs = args if self.prologue is None else [*args, *self.prologue(*args)]
            out = lowered(inputs)
            del inputs
        args.clear()  # the boxed convention: inputs may be freed as early as the caller allows
        return out

    def dump(self):
        if self.lowered is not None:
            return self.lowered.program.dump()
        return "\n".join(p.program.dump() for p in self.programs.values() if p is not None)


def stats():
    return dict(_stats)


def reset_stats():
    for k in _stats:
        _stats[k] = 0
