"""What the generation step checks before any compile work: constructs it refuses by name, and its logits.

:func:`refuse_unsupported` names a construct of the model the slot-cache step
(``frontend.causal_lm``) cannot reproduce; :func:`check_step` runs the step on
a left-padded batch against the model's own forward.
"""

from __future__ import annotations

import torch

from ..errors import EgraftError, InputError
from ..ir import dtypes
from .slot_cache import MASK_IMPLEMENTATIONS


def text_config(model):
    """The model's (text) decoder config."""
    cfg = model.config
    return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg


_KV_LAYERS = {"full_attention", "sliding_attention", "chunked_attention"}  # layer types with a plain K/V cache


def refuse_unsupported(model) -> None:
    """Raise InputError naming the construct when `model` has one the slot-cache step cannot reproduce:

    * an encoder-decoder (the step is a decoder over its own tokens);
    * an attention implementation other than sdpa / eager (flash, flex, paged: their masks are not dense
      tensors, so the step's per-row slot masks cannot reach them);
    * layers without a K/V cache (``config.layer_types``: linear attention, Mamba, convolution, recurrent ...);
    * multi-head latent attention (DeepSeek V2/V3: ``config.kv_lora_rank``): caches of other shapes;
    * local attention masked by a buffer of the layer's own (GPT-Neo's ``attention_type == "local"``): the
      window is cut from the end of the key length, not from each row's positions, and the step's rows sit at
      slots ``0 .. n-1`` of a cache longer than any of them.
    Sliding windows built through transformers' masking_utils (Mistral, Gemma 2, Starcoder2) are reproduced
    (chunked attention, Llama 4's, goes through the same mask functions but is not in the test matrix); ALiBi
    (Bloom, Falcon, MPT) is built from the 2-D mask the step passes.
    """
    name = type(model).__name__
    cfg = text_config(model)
    if getattr(model.config, "is_encoder_decoder", False) or getattr(cfg, "is_encoder_decoder", False):
        raise InputError(f"{name} is an encoder-decoder model; egraft compiles generation for decoder-only "
                         "causal LMs (a step over one KV cache per layer)")
    impl = getattr(cfg, "_attn_implementation", None) or getattr(model.config, "_attn_implementation", None)
    if impl not in MASK_IMPLEMENTATIONS:
        raise InputError(f"{name} runs attn_implementation={impl!r}; egraft's generation step builds a dense "
                         "mask for each row's cache slots, which only the 'sdpa' and 'eager' implementations take: "
                         "load the model with attn_implementation='sdpa' (or 'eager')")
    other = sorted(set(getattr(cfg, "layer_types", None) or ()) - _KV_LAYERS)
    if other:
        raise InputError(f"{name} has layers of type {other} (config.layer_types); egraft's generation step "
                         f"holds a K/V cache per layer and takes only attention layers ({sorted(_KV_LAYERS)})")
    if getattr(cfg, "kv_lora_rank", None):
        raise InputError(f"{name} uses multi-head latent attention (config.kv_lora_rank={cfg.kv_lora_rank}, "
                         "DeepSeek V2/V3's): its cached keys and values are per attention head, with other head "
                         "sizes than config.num_key_value_heads x head_dim, which egraft's generation step sizes "
                         "its caches by")
    local = [n for n, m in model.named_modules() if getattr(m, "attention_type", None) == "local"]
    if local:
        raise InputError(f"{name} has local attention layers ({', '.join(local)}): each masks its keys with a "
                         "causal buffer of its own sliced from the END of the key length (GPT-Neo's local "
                         "attention), not by position, and egraft's slot cache holds each row at slots 0..n-1 "
                         "of a longer cache, so the window would not follow the row; sliding windows built "
                         "through transformers' masking_utils (Mistral, Gemma 2, Starcoder2) are supported")


def _check_tolerance(dtype: torch.dtype) -> float:
    return 1e-3 if torch.finfo(dtype).bits >= 32 else 3e-2


def check_step(step, programs) -> None:
    """Run `step` (eagerly, through the runtime's :class:`~egraft.runtime.generation.Engine`: ladder chunks,
    its buckets, filler) on two left-padded rows of different lengths, a prompt and two teacher-forced decode
    steps, and compare each logits row with the model's own forward over the padded batch, as transformers'
    ``generate`` calls it (``position_ids = cumsum(mask) - 1`` when the forward takes them).

    A model that computes something from the padded sequence the slot cache does not reproduce (positions
    from the cache length, a mask of its own, a layout the cache does not follow) is refused here with an
    InputError, before any compile work, instead of generating other tokens than transformers.  The caches
    are zeroed afterwards.  A batch this small cannot show a sliding window wider than it: those are read from
    the model's own mask functions (:class:`~egraft.frontend.slot_cache.SlotMasks`)."""
    import inspect

    import numpy as np

    from ..runtime.generation import Engine

    spec, model = step.spec, step.model
    name = type(model).__name__
    rows = min(2, spec.max_batch)
    total = min(spec.max_length, 12)  # the longer row's tokens: prompt and decode steps
    new = min(2, total - 1)
    lengths = [total - new, max(1, (total - new) // 2)][:rows]
    width = lengths[0]
    vocab = spec.vocab_size
    embeddings = model.get_input_embeddings() if callable(getattr(model, "get_input_embeddings", None)) else None
    vocab = min(vocab, getattr(embeddings, "num_embeddings", vocab))
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (rows, width + new), generator=g)
    mask = torch.ones(rows, width + new, dtype=torch.int64)
    for b, n in enumerate(lengths):
        mask[b, :width - n] = 0
    device = step._slots.device
    tokens, mask = tokens.to(device), mask.to(device)
    kwargs = {}
    if "position_ids" in inspect.signature(model.forward).parameters:  # what generate passes
        kwargs["position_ids"] = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    try:
        with torch.no_grad():
            want = model(input_ids=tokens, attention_mask=mask, use_cache=False, **kwargs).logits.float()
            engine = Engine(programs, step.state())
            last = engine.prefill({b: tokens[b, width - n:width] for b, n in enumerate(lengths)})
            got = [torch.stack([last[b] for b in range(rows)])]
            fed = np.zeros(spec.max_batch, dtype=bool)
            fed[:rows] = True
            for k in range(new):
                ids = np.zeros(spec.max_batch, dtype=np.int64)
                ids[:rows] = tokens[:, width + k].cpu().numpy()
                got.append(engine.decode(ids, fed)[:rows])
    except EgraftError:
        raise
    except Exception as e:  # the model does not run as the step: say so, with the model's own error
        raise InputError(f"{name} does not run as egraft's slot-cache generation step: "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    finally:
        for x in step.state():
            x.zero_()
    scale = max(1.0, float(want.abs().max()))
    tol = _check_tolerance(getattr(torch, spec.state[0].dtype))
    if any(getattr(m, "activations", None) for m in model.modules()):  # lossy w8a8: a rounded near-half flips
        tol = max(tol, dtypes.LOSSY_BOUND)
    for k, logits in enumerate(got):
        diff = (logits.float() - want[:, width - 1 + k]).abs().amax(dim=-1)
        if not bool(torch.isfinite(diff).all()) or float(diff.max()) > tol * scale:
            b = int(torch.nan_to_num(diff, nan=float("inf")).argmax())
            where = "after its prompt" if k == 0 else f"at decode step {k}"
            raise InputError(f"{name}: egraft's slot-cache step does not compute the model's logits on a "
                             f"left-padded batch (row {b} of lengths {lengths}, {where}: max |difference| "
                             f"{float(diff[b]):.3g} against logits up to {scale:.3g}, tolerance {tol * scale:.3g}): "
                             "the model derives something from the padded sequence (positions from the cache "
                             "length, a mask or a bias of its own) that the step's per-row slots do not "
                             "reproduce, so generation would not give transformers' tokens")


__all__ = ["check_step", "refuse_unsupported", "text_config"]
