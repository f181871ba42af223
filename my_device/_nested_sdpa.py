"""scaled_dot_product_attention of jagged nested tensors on mydev, as on the CPU.

PyTorch computes a jagged SDPA it has no fused kernel for (always, off CUDA) by its math path
(torch.nested._internal.sdpa, the SDPBackend.MATH branch), which converts the inputs to strided
nested tensors. Strided nested tensors have no kernels on mydev (csrc/native/NestedTensor.cpp
raises NotImplementedError naming the op), and NestedTensor.__torch_function__ takes any
NotImplementedError from the jagged implementation for "not handled here" and calls the C++
operator instead, which raised PyTorch's misleading "If inputs are nested tensors they must be
contiguous".

For a mydev input that PyTorch would send to that math path, this computes the same thing
without strided nested tensors: each sequence's attention is a dense one (the same
aten::_scaled_dot_product_attention_math the strided path runs per sequence) over the jagged
values, and the output is a jagged view with the query's offsets, as PyTorch's path builds it.
Every other input, and the selection (sdpa_kernel settings, the checks that reject masks,
is_causal and non-contiguous inputs), stays PyTorch's.
`test/test_nested.py::test_torch_jagged_attention_still_needs_strided_nested_kernels`
fails once PyTorch's own path works on mydev, which is when this module should go.
"""
import torch

from . import _patches

_BACKEND = "mydev"


def _sequences(nt, lengths_of):
    """The dense [heads, length, dim] tensors of a jagged [batch, heads, j, dim] tensor."""
    values = nt.transpose(1, 2).values()                 # [sum of lengths, heads, dim]
    return [v.transpose(0, 1) for v in values.split(lengths_of(nt.offsets()))]


def _math_attention(query, key, value, dropout_p, scale, enable_gqa):
    from torch.nested._internal.nested_tensor import nested_view_from_values_offsets_lengths

    # The split needs the lengths on the host (as PyTorch's path): one read per distinct offsets tensor
    # (self-attention's query, key and value share theirs).
    read = {}

    def lengths_of(offsets):
        if id(offsets) not in read:
            read[id(offsets)] = offsets.diff().tolist()
        return read[id(offsets)]

    outputs = [
        torch._scaled_dot_product_attention_math(q, k, v, None, dropout_p, False, scale=scale,
                                                 enable_gqa=enable_gqa)[0].transpose(0, 1)
        for q, k, v in zip(*(_sequences(t, lengths_of) for t in (query, key, value)))
    ]
    return nested_view_from_values_offsets_lengths(
        torch.cat(outputs),
        query.offsets(),
        lengths=query.lengths(),
        min_seqlen=query._maybe_min_seqlen,
        max_seqlen=query._maybe_max_seqlen,
    ).transpose(1, 2)


def torch_jagged_scaled_dot_product_attention():
    """PyTorch's own jagged SDPA (for the test that notices when this module is no longer needed)."""
    from torch.nested._internal import ops

    function = ops.jagged_scaled_dot_product_attention
    return getattr(function, "_torch_original", function)


def _install(ops) -> None:
    from torch.nested._internal import sdpa
    from torch.nested._internal.nested_tensor import NestedTensor
    from torch.nn.attention import SDPBackend

    original = ops.jagged_scaled_dot_product_attention

    def jagged_scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                            scale=None, enable_gqa=False):
        args = (attn_mask, dropout_p, is_causal, scale, enable_gqa)
        inputs = (query, key, value)
        if not (all(isinstance(t, NestedTensor) and t.device.type == _BACKEND for t in inputs)
                and attn_mask is None and not is_causal):
            return original(query, key, value, *args)
        query, key, value, attn_mask = sdpa._autocast(query, key, value, attn_mask)
        sdpa._validate_sdpa_input(query, key, value, attn_mask, dropout_p, is_causal, scale)
        # PyTorch's dense shortcut (ragged batch dimension) works on mydev as it is.
        dense_shortcut = min(t.dim() for t in (query, key, value)) > 3 and query._ragged_idx == 1
        if dense_shortcut or sdpa._select_sdp_backend(query, key, value, attn_mask, dropout_p, is_causal,
                                                      enable_gqa) != SDPBackend.MATH:
            return original(query, key, value, *args)
        return _math_attention(query, key, value, dropout_p, scale, enable_gqa)

    jagged_scaled_dot_product_attention.__doc__ = original.__doc__
    # jagged_torch_function (in this module) calls it by its module-global name.
    _patches.replace(
        ops, "jagged_scaled_dot_product_attention", jagged_scaled_dot_product_attention,
        target="torch.nested._internal.ops.jagged_scaled_dot_product_attention",
        why="off CUDA, torch's jagged attention converts to strided nested tensors, which have no kernels on mydev",
        test="test_nested.py::test_torch_jagged_attention_still_needs_strided_nested_kernels")


def install() -> None:
    # Importing torch.nested's internals at `import my_device` would cost every user; they are imported
    # with the first jagged nested tensor.
    from ._import_hooks import when_imported

    when_imported("torch.nested._internal.ops", _install)
