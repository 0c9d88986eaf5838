"""Context parallelism on CPU: torch's ring attention for the CPU flash-attention kernel.

torch's `context_parallel` sends `scaled_dot_product_attention` through DTensor with the query, key and
value sharded on the sequence dimension, and maps only the CUDA kernels (flash, efficient, cuDNN) to its
ring attention. On CPU the op is `aten._scaled_dot_product_flash_attention_for_cpu`, which has no such
mapping, so every CP step fails. This module adds the mapping for that op and its backward, calling
torch's own ring functions (`_templated_ring_attention` and its backward), which already take the attention
kernel as an argument: the CPU kernel returns (output, logsumexp) as the CUDA flash kernel does.

These are private torch modules. The registration is made only on the torch versions it was checked
against (`SUPPORTED_TORCH`) and only when every name it uses is there; otherwise `check_cpu_support`
raises, naming the torch version, so that context parallelism on CPU is an error, never a wrong result.
"""

from __future__ import annotations

from typing import Any

import torch

# The torch releases whose context-parallel internals this module was written and tested against.
SUPPORTED_TORCH = ((2, 13),)

_REGISTERED = False


def _torch_release() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _attention_module() -> Any:
    from torch.distributed.tensor.experimental._context_parallel import _attention

    return _attention


def cpu_support_problem() -> str | None:
    """Why context parallelism cannot run on CPU with this torch (None when it can)."""
    if _torch_release() not in SUPPORTED_TORCH:
        supported = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_TORCH)
        return (
            f"context parallelism on CPU needs torch {supported} (this is torch {torch.__version__}): "
            "it maps the CPU attention kernel onto torch's private ring-attention functions, which "
            "change between releases. Run on CUDA, or use a supported torch."
        )
    try:
        attention = _attention_module()
        from torch.distributed.tensor import DTensor

        needed = (
            isinstance(attention.custom_ops, dict),
            callable(attention._templated_ring_attention),
            callable(attention._templated_ring_attention_backward),
            isinstance(DTensor._op_dispatcher._custom_op_handlers, dict),
            hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"),
            hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward"),
        )
    except (ImportError, AttributeError) as error:
        needed = (False,)
        detail = f" ({error})"
    else:
        detail = ""
    if not all(needed):
        return (
            f"context parallelism on CPU cannot run with torch {torch.__version__}: its private "
            f"context-parallel module is not the one Cadence was written for{detail}. Run on CUDA."
        )
    return None


def check_cpu_support() -> None:
    """Raise a RuntimeError naming the torch version when CP on CPU cannot be made exact here."""
    problem = cpu_support_problem()
    if problem is not None:
        raise RuntimeError(problem[0].upper() + problem[1:])


def register_cpu_ring_attention() -> None:
    """Map the CPU flash-attention op and its backward to torch's ring attention (once; checked)."""
    global _REGISTERED
    if _REGISTERED:
        return
    check_cpu_support()
    aten = torch.ops.aten
    # torch's `context_parallel` installs `custom_ops` as DTensor's op handlers while it is entered and
    # removes them when it exits, so these two entries are live only inside the context.
    handlers = _attention_module().custom_ops
    handlers[aten._scaled_dot_product_flash_attention_for_cpu.default] = _ring_handler
    handlers[aten._scaled_dot_product_flash_attention_for_cpu_backward.default] = _ring_handler
    _REGISTERED = True


def _sequence_sharded(args: Any, kwargs: dict[str, Any]) -> tuple[Any, list[Any], dict[str, Any]]:
    """(mesh, local args, local kwargs): every DTensor must be sharded on the sequence dimension (2)."""
    from torch.distributed.tensor import DTensor, Shard

    mesh = None

    def local(value: Any) -> Any:
        nonlocal mesh
        if not isinstance(value, DTensor):
            return value
        if value.device_mesh.ndim != 1 or tuple(value.placements) != (Shard(2),):
            raise NotImplementedError(
                "Context parallel attention on CPU needs query, key and value sharded on the "
                f"sequence dimension of a one-dimensional mesh, got {value.placements}."
            )
        mesh = value.device_mesh
        return value.to_local()

    local_args = [local(a) for a in args]
    local_kwargs = {k: local(v) for k, v in kwargs.items()}
    return mesh, local_args, local_kwargs


def _ring_handler(op_call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """DTensor's handler of the CPU flash-attention ops inside `context_parallel`: ring attention."""
    from torch.distributed.tensor import DTensor, Shard

    attention = _attention_module()
    aten = torch.ops.aten
    mesh, local_args, local_kwargs = _sequence_sharded(args, kwargs)
    if local_kwargs.get("attn_mask") is not None:
        raise NotImplementedError(
            "Context parallel attention takes no attn_mask: use is_causal=True (the hooks Cadence "
            "puts on self-attention modules turn a causal mask into is_causal)."
        )
    local_kwargs.pop("attn_mask", None)
    group = mesh.get_group()
    if op_call == aten._scaled_dot_product_flash_attention_for_cpu.default:
        names = ("query", "key", "value", "dropout_p", "is_causal")
        call = dict(zip(names, local_args), **local_kwargs)
        results = attention._templated_ring_attention(
            group,
            2,
            aten._scaled_dot_product_flash_attention_for_cpu,
            query=call.pop("query"),
            key=call.pop("key"),
            value=call.pop("value"),
            is_causal=call.pop("is_causal", False),
            **call,
        )
    else:
        names = (
            "grad_out", "query", "key", "value", "out", "logsumexp", "dropout_p", "is_causal",
        )  # fmt: skip
        call = dict(zip(names, local_args), **local_kwargs)
        results = attention._templated_ring_attention_backward(
            group,
            2,
            aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
            grad_out=call.pop("grad_out"),
            grad_out_name="grad_out",
            query=call.pop("query"),
            key=call.pop("key"),
            value=call.pop("value"),
            out=call.pop("out"),
            logsumexp=call.pop("logsumexp"),
            is_causal=call.pop("is_causal"),
            **call,
        )
    # Every output (attention output and logsumexp; the three gradients) is sharded like the inputs.
    return tuple(
        DTensor.from_local(t, mesh, [Shard(2)], run_check=False) if t is not None else None
        for t in results
    )
