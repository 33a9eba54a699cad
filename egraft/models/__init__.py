"""Reference workloads egraft is tested and benchmarked on.

Plain ``torch.nn.Module``s (no egraft imports). Each registry entry is a
``WorkloadSpec``: a seeded factory, an input maker, and two size presets —
``tiny`` (fast tests on CPU) and ``bench`` (realistic sizes for benchmarks)::

    from egraft.models import MODELS, make
    spec  = MODELS["gpt2_block"]
    model = spec.build("tiny", seed=0)                 # or spec.factory(hidden=64, seed=0)
    args  = spec.example_inputs(model, batch=2, seq=8, seed=0)
    model, args = make("llama_block", size="bench")    # both at once
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

import torch
from torch import nn

from . import attention, gpt2_block, llama_block, mlp, resnet_block, stacks
from ._common import RMSNorm

InputMaker = Callable[[nn.Module, int, int, int], tuple[torch.Tensor, ...]]
SIZES = ("tiny", "bench")


@dataclass(frozen=True)
class WorkloadSpec:
    """One workload: how to build it and how to make inputs for it.

    ``factory(**sizes, seed=0)`` returns a float32 module in eval mode.
    ``tiny`` / ``bench`` are factory keyword sizes; ``tiny_inputs`` /
    ``bench_inputs`` are the matching ``batch`` and ``seq`` (for the conv
    block ``seq`` is the image side; the plain MLP ignores it).
    """

    name: str
    factory: Callable[..., nn.Module]
    make_inputs: InputMaker
    tiny: Mapping[str, Any]
    bench: Mapping[str, Any]
    description: str
    tiny_inputs: Mapping[str, int] = field(default_factory=lambda: {"batch": 2, "seq": 8})
    bench_inputs: Mapping[str, int] = field(default_factory=lambda: {"batch": 4, "seq": 256})

    def sizes(self, size: str = "tiny") -> dict[str, Any]:
        if size not in SIZES:
            raise ValueError(f"size must be one of {SIZES}, got {size!r}")
        return dict(self.tiny if size == "tiny" else self.bench)

    def build(self, size: str = "tiny", seed: int = 0, **overrides: Any) -> nn.Module:
        """The model at a size preset, with any factory keyword overridden."""
        return self.factory(**{**self.sizes(size), **overrides}, seed=seed)

    def example_inputs(self, model: nn.Module, batch: int | None = None,
                       seq: int | None = None, seed: int = 0,
                       size: str = "tiny") -> tuple[torch.Tensor, ...]:
        """Inputs for ``model`` as a tuple; unset ``batch``/``seq`` come from the size preset."""
        if size not in SIZES:
            raise ValueError(f"size must be one of {SIZES}, got {size!r}")
        preset = self.tiny_inputs if size == "tiny" else self.bench_inputs
        batch = preset["batch"] if batch is None else batch
        seq = preset["seq"] if seq is None else seq
        return self.make_inputs(model, batch, seq, seed)


def _spec(name: str, factory: Callable[..., nn.Module], make_inputs: InputMaker,
          tiny: dict[str, Any], bench: dict[str, Any], description: str,
          **input_presets: Mapping[str, int]) -> WorkloadSpec:
    return WorkloadSpec(name, factory, make_inputs, MappingProxyType(tiny),
                        MappingProxyType(bench), description,
                        **{k: MappingProxyType(dict(v)) for k, v in input_presets.items()})


_hidden = mlp.hidden_states_inputs

_SPECS = [
    _spec("mlp", mlp.mlp, mlp.mlp_inputs,
          {"d": 32, "hidden": 64}, {"d": 1024, "hidden": 4096},
          "Linear-GELU-Linear on [batch, d]",
          tiny_inputs={"batch": 4, "seq": 1}, bench_inputs={"batch": 256, "seq": 1}),
    _spec("gpt2_block", gpt2_block.gpt2_block, _hidden,
          {"hidden": 32, "heads": 4}, {"hidden": 768, "heads": 12},
          "GPT-2 pre-LN block: fused c_attn, causal SDPA, tanh-GELU MLP"),
    _spec("gpt2_stack", gpt2_block.gpt2_stack, gpt2_block.gpt2_stack_inputs,
          {"n_layers": 2, "hidden": 32, "heads": 4},
          {"n_layers": 12, "hidden": 768, "heads": 12},
          "N GPT-2 blocks + final LayerNorm (bench: GPT-2 small shape)",
          bench_inputs={"batch": 1, "seq": 128}),
    _spec("llama_block", llama_block.llama_block, _hidden,
          {"hidden": 32, "heads": 4, "kv_heads": 2, "intermediate": 64},
          {"hidden": 2048, "heads": 32, "kv_heads": 4, "intermediate": 5632},
          "Llama block: RMSNorm, rotary GQA (expand+reshape), SwiGLU"),
    _spec("resnet_block", resnet_block.resnet_block, resnet_block.resnet_block_inputs,
          {"in_channels": 8, "out_channels": 16, "stride": 2},
          {"in_channels": 64, "out_channels": 128, "stride": 2},
          "ResNet basic block, eval-mode BN, 1x1 downsample shortcut",
          bench_inputs={"batch": 8, "seq": 56}),
    _spec("rmsnorm_linear", stacks.rmsnorm_linear, _hidden,
          {"hidden": 32, "out": 48}, {"hidden": 4096, "out": 4096},
          "explicit RMSNorm then bias-free Linear"),
    _spec("lora_linear", stacks.lora_linear, _hidden,
          {"hidden": 32, "out": 48, "rank": 4}, {"hidden": 4096, "out": 4096, "rank": 16},
          "x@W^T + ((x@A)@B)*scaling with non-zero B"),
    _spec("gated_mlp", mlp.gated_mlp, _hidden,
          {"hidden": 32, "intermediate": 64}, {"hidden": 2048, "intermediate": 5632},
          "SwiGLU: down(silu(gate(x)) * up(x))"),
    _spec("gqa_attention", attention.gqa_attention, _hidden,
          {"hidden": 32, "heads": 4, "kv_heads": 2},
          {"hidden": 2048, "heads": 32, "kv_heads": 4},
          "grouped-query attention (repeat_interleave), causal SDPA"),
    _spec("qknorm_attention", attention.qknorm_attention, _hidden,
          {"hidden": 32, "heads": 4, "kv_heads": 2},
          {"hidden": 2048, "heads": 32, "kv_heads": 4},
          "GQA with per-head RMSNorm on Q and K"),
    _spec("mask_attention", attention.mask_attention, attention.mask_attention_inputs,
          {"hidden": 32, "heads": 4, "kv_heads": 2, "mask": "bool"},
          {"hidden": 2048, "heads": 32, "kv_heads": 4, "mask": "bool"},
          "GQA with an explicit boolean attn_mask input [batch, 1, seq, seq]"),
    _spec("mask_attention_additive", attention.mask_attention, attention.mask_attention_inputs,
          {"hidden": 32, "heads": 4, "kv_heads": 2, "mask": "additive"},
          {"hidden": 2048, "heads": 32, "kv_heads": 4, "mask": "additive"},
          "GQA with an additive float attn_mask input (0 / -inf)"),
]

MODELS: Mapping[str, WorkloadSpec] = MappingProxyType({s.name: s for s in _SPECS})


def get(name: str) -> WorkloadSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(MODELS)}") from None


def make(name: str, size: str = "tiny", seed: int = 0, batch: int | None = None,
         seq: int | None = None, **overrides: Any) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build workload ``name`` and example inputs for it in one call."""
    spec = get(name)
    model = spec.build(size, seed=seed, **overrides)
    return model, spec.example_inputs(model, batch=batch, seq=seq, seed=seed, size=size)


__all__ = ["MODELS", "SIZES", "WorkloadSpec", "RMSNorm", "get", "make"]
