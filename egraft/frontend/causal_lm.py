"""A Hugging Face causal LM as ONE step function with its KV cache as in-place state.

``step_module(model, max_batch, max_length)`` wraps a transformers causal LM
(GPT-2, Llama, Mistral, Gemma 2, OPT, Bloom, Falcon, MPT, ...: the families of
tests/generation/test_families.py) in an ``nn.Module`` whose
buffers are the per-layer K and V caches, ``[max_batch, kv_heads, cache_len,
head_dim]``, and whose forward is the calling convention of
``egraft.runtime.step_spec`` (see its docstring)::

    logits = step(input_ids, position_ids, slot_mask)   # int64 [r, T], int64 [r, T], bool [r, C]

It writes the T tokens' K and V of every layer into the caches in place, each
token at the slot its position names (``scatter_`` along the sequence axis,
per row, so rows may be at different lengths), and returns the logits of each
row's last column, ``[r, vocab]``; it reads the caches' first ``C`` slots
(``slot_mask``'s width) of the first ``r`` rows, a bucket of
``runtime.step_spec``.  The model runs unchanged: it is handed a
``transformers.cache_utils.Cache`` whose layers do that scatter and return the
first ``C`` slots, ``position_ids``, and the slot mask as its 2-D
``attention_mask`` (int64 ``[r, C]``, 1 where a slot holds a token).  Every
4-D mask the model builds through transformers' ``masking_utils``
(``create_causal_mask``, ``create_sliding_window_causal_mask``, ...) is made
by :class:`~egraft.frontend.slot_cache.SlotMasks` while the step runs: the model's own mask function
(causal, a sliding window, chunks) evaluated at each query's position and each
key's slot, and the slot mask, as an additive mask (0 or ``finfo.min``)::

    allowed[b, 0, t, j] = slot_mask[b, j] and mask_function(b, 0, position_ids[b, t], j)  # causal: j <= position

So a sliding window follows each row's positions (Mistral, Gemma 2's alternating
layers, Starcoder2).  A slot's position is the slot, so the cumsum of the 2-D
mask minus one is every key's position, as it is for transformers' left-padded
mask: ALiBi built from it (Bloom, Falcon) gives each key the bias transformers
gives it, and a model that reads positions from the mask (OPT, BioGPT) is
handed ``position_ids``.  ``get_seq_length`` is ``C - T`` (past + new = the
keys returned; rows differ, there is no one count).  Positions past
``max_length - 1`` (only filler has them) are clamped for the model's
position embeddings, so a filler column never indexes past the table.

:func:`step_module` refuses, with an InputError naming it, a construct the
step cannot reproduce (:func:`~egraft.frontend.step_check.refuse_unsupported`: GPT-Neo's local attention,
layers without a K/V cache, attention implementations without dense masks),
then runs the step on a left-padded batch against the model's own forward
(:func:`~egraft.frontend.step_check.check_step`), before any compile work.

``torch.export`` of the module (:func:`export_step`, one per chunk size) shows
each cache as a ``BUFFER_MUTATION`` written by ``aten.scatter``.
:class:`StepTracer` gives the IR graph of every bucket from one export per
*family* of buckets (:func:`family`), with the chunk and context sizes
symbolic, instead of one export per bucket.
"""

from __future__ import annotations

import inspect
import time
from typing import Sequence

import torch

from ..errors import EgraftError, InputError
from ..runtime.step_spec import Bucket, StateSpec, StepPrograms, StepSpec
from ..runtime.sampling import Sampling, eos_tuple
from .slot_cache import SlotMasks, slot_layer_class
from .step_check import check_step, refuse_unsupported, text_config
from .tracer import export_program, lower_program

DEFAULT_CHUNKS = (1, 4, 16, 64, 256)
FIRST_CONTEXT = 128  # the smallest context bucket; the default buckets double from it (default_contexts)
MIN_CONTEXT_SAVING = 0.1  # of a full step's reads: what a default context bucket must save to be compiled
DEFAULT_ROWS = (1,)  # every chunk size is also compiled for a batch of one row (below max_batch): row buckets

# generation_config settings whose logits processors the light loop does not apply, with their neutral values
_NEUTRAL = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
            "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "min_length": 0, "min_new_tokens": None,
            "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "min_p": None, "top_h": None,
            "suppress_tokens": None, "begin_suppress_tokens": None, "forced_bos_token_id": None,
            "forced_eos_token_id": None, "sequence_bias": None, "num_beams": 1, "guidance_scale": None,
            "renormalize_logits": False, "exponential_decay_length_penalty": None, "remove_invalid_values": False,
            "watermarking_config": None, "num_return_sequences": 1}


def _kv_shapes(model) -> list[tuple[int, int]]:
    """(kv_heads, head_dim) of each layer, from the config as transformers' own static cache reads it."""
    cfg = text_config(model)
    layers = cfg.num_hidden_layers
    try:
        from transformers.configuration_utils import get_head_shapes

        heads, dim = get_head_shapes(cfg)
    except (ImportError, AttributeError):
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    heads = heads if isinstance(heads, list) else [heads] * layers
    dim = dim if isinstance(dim, list) else [dim] * layers
    return list(zip(heads, dim))


def generation_defaults(model) -> Sampling:
    """The sampling settings ``model.generate()`` would use when a call sets none, as plain values.

    transformers merges ``model.generation_config`` over its global defaults
    (``GenerationConfig._get_default_generation_params``: ``top_k=50``, ...).
    Settings whose logits processors the light loop does not apply
    (repetition penalty, min_length, ...) are refused with InputError naming them.
    """
    gc = model.generation_config
    given = gc.to_dict()
    fallback = gc._get_default_generation_params() if hasattr(gc, "_get_default_generation_params") else {}

    def value(key, default):
        v = given.get(key)
        return v if v is not None else fallback.get(key, default)

    odd = {k: given[k] for k, neutral in _NEUTRAL.items() if given.get(k) not in (None, neutral)}
    if odd:
        raise InputError(f"the model's generation_config sets {odd}, which egraft's generation loop does not "
                         "apply (it applies temperature, top_k and top_p): set them to their defaults "
                         f"({ {k: _NEUTRAL[k] for k in odd} }) on model.generation_config")
    return Sampling(do_sample=bool(value("do_sample", False)), temperature=float(value("temperature", 1.0)),
                    top_k=value("top_k", 50), top_p=float(value("top_p", 1.0)),
                    eos_token_id=eos_tuple(gc.eos_token_id), pad_token_id=gc.pad_token_id)


class StepModule(torch.nn.Module):
    """A causal LM's step over slot caches (see the module docstring); ``spec`` describes it for the runtime."""

    def __init__(self, model, max_batch: int, max_length: int, chunks: Sequence[int] = DEFAULT_CHUNKS,
                 contexts: Sequence[int] | None = None, rows: Sequence[int] | None = None):
        super().__init__()
        for name, v in (("max_batch", max_batch), ("max_length", max_length)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(f"{name}={v!r}: it must be an int >= 1")
        cfg = text_config(model)
        for key in ("max_position_embeddings", "max_seq_len"):  # MPT sizes its ALiBi table by max_seq_len
            limit = getattr(cfg, key, None)
            if isinstance(limit, int):
                if max_length > limit:
                    raise InputError(f"max_length={max_length} is over the model's {key}={limit}")
                break
        ladder = sorted({int(c) for c in chunks if 1 <= int(c) <= max_length} | {1})
        self.model = model
        self._cache_kw = cache_keyword(model)
        self.max_length = max_length
        cache_len = max_length + ladder[-1]
        dtype = next(model.parameters()).dtype
        device = next(model.parameters()).device
        specs = []
        for i, (heads, dim) in enumerate(_kv_shapes(model)):
            for kind in ("k", "v"):
                name = f"cache_{kind}{i}"
                self.register_buffer(name, torch.zeros(max_batch, heads, cache_len, dim, dtype=dtype, device=device))
                specs.append(StateSpec(name, (max_batch, heads, cache_len, dim), str(dtype).removeprefix("torch.")))
        head = model.get_output_embeddings()
        vocab = getattr(head, "out_features", None) or head.weight.shape[0]  # (a quantised head has no .weight)
        if contexts is None:
            slot = sum(s.shape[0] * s.shape[1] * s.shape[3] for s in specs) * dtype.itemsize  # every layer and row
            # (a quantised layer holds its values and scales as buffers; a tied table counts once)
            held = {t.data_ptr(): t for t in list(model.parameters()) + list(model.buffers())}
            weights = sum(t.numel() * t.element_size() for t in held.values())
            contexts = default_contexts(max_length, slot, weights)
        bad = [c for c in contexts if not isinstance(c, int) or isinstance(c, bool) or not 1 <= c < max_length]
        if bad:
            raise InputError(f"contexts={list(contexts)}: each context bucket must be an int in [1, {max_length}) "
                             f"(below max_length={max_length}, which every call's full program reads)")
        rows = tuple(c for c in DEFAULT_ROWS if c < max_batch) if rows is None else tuple(rows)
        bad = [r for r in rows if not isinstance(r, int) or isinstance(r, bool) or not 1 <= r < max_batch]
        if bad:
            raise InputError(f"rows={list(rows)}: each row bucket must be an int in [1, {max_batch}) "
                             f"(max_batch={max_batch} rows is the full programs' own size)")
        self.spec = StepSpec(max_batch=max_batch, max_length=max_length, chunks=tuple(ladder), vocab_size=vocab,
                             state=tuple(specs), defaults=generation_defaults(model),
                             contexts=tuple(sorted(set(contexts))), rows=tuple(sorted(set(rows))),
                             max_context=max_length)
        self._layer = slot_layer_class()
        self.register_buffer("_slots", torch.arange(cache_len, device=device), persistent=False)
        table = model.get_input_embeddings()
        self._tokens = min(vocab, getattr(table, "num_embeddings", vocab))  # the ids example_inputs spreads over

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, slot_mask: torch.Tensor) -> torch.Tensor:
        from transformers.cache_utils import Cache

        names = [s.name for s in self.spec.state]
        context = slot_mask.shape[1]  # the slots this call reads (its bucket's context)
        layers = [self._layer(getattr(self, k), getattr(self, v), position_ids, context)
                  for k, v in zip(names[::2], names[1::2])]
        cache = Cache(layers=layers)
        # the 2-D mask transformers' models take (int64, 1 = a token): the slot mask, over the slots the call reads.
        # Its cumsum - 1 is each slot's position (= the slot), which is what an ALiBi model (Bloom, Falcon) builds
        # its key biases from, as it does from a left-padded mask; every 4-D mask comes from SlotMasks.
        with SlotMasks(position_ids, self._slots[:context]) as masks:
            out = self.model(input_ids=input_ids, position_ids=position_ids.clamp(max=self.max_length - 1),
                             attention_mask=slot_mask.to(torch.int64), use_cache=True, logits_to_keep=1,
                             **{self._cache_kw: cache})
        if not masks.built:
            raise InputError(f"{type(self.model).__name__} built no attention mask through transformers' "
                             "masking_utils (create_causal_mask, ...), which is how egraft's step masks each "
                             "row's slots: its attention would read filler and other rows' stale slots")
        return out.logits[:, -1, :]

    def state(self) -> list[torch.Tensor]:
        """The module's own cache buffers, in ``spec.state`` order."""
        return [getattr(self, s.name) for s in self.spec.state]

    def example_inputs(self, chunk: int, context: int | None = None,
                       rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids, position_ids, slot_mask) of the chunk-`chunk` call of `rows` rows (None: max_batch) reading
        `context` slots (None: max_length), for ``torch.export`` / compiling."""
        b, dev = rows or self.spec.max_batch, self._slots.device
        context = context or self.spec.full_context
        # tokens spread over the vocabulary (not all one token): the compile checks each program on these and on a
        # random set drawn within their range (``measure.like``), so the embedding and the head are read at many rows
        ids = ((torch.arange(b * chunk, device=dev) * 7919 + 13) % self._tokens).reshape(b, chunk)
        pos = torch.arange(chunk, device=dev)[None, :].expand(b, chunk).contiguous()
        mask = self._slots[None, :context].expand(b, -1) < chunk
        return ids, pos, mask


def default_contexts(max_length: int, slot_bytes: int = 0, weight_bytes: int = 0) -> tuple[int, ...]:
    """The default context buckets: FIRST_CONTEXT, doubling, up to half of `max_length` (which the full programs
    read; a bucket past half of it saves less than it costs to compile): max_length 640 -> 128, 256.

    Each bucket is a program per chunk to compile and load, and what it saves a step is the cache it does not
    read: `slot_bytes` (the cache bytes of one slot, every layer and row) times the slots it skips.  A bucket is
    kept only when that is at least ``MIN_CONTEXT_SAVING`` of a full step's reads (`weight_bytes` plus the full
    cache): a 135 M-parameter model's cache at max_length 256 is 2 % of its weights, and a bucket there would buy
    under 1 % of a step for four more programs.  Without sizes (0) every bucket is kept."""
    out, c = [], FIRST_CONTEXT
    full = weight_bytes + max_length * slot_bytes
    while 2 * c <= max_length:
        if (max_length - c) * slot_bytes >= MIN_CONTEXT_SAVING * full:
            out.append(c)
        c *= 2
    return tuple(out)


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword `model`'s forward takes its cache by: ``cache`` (transformers 5.24 and later) or
    ``past_key_values`` (earlier 5.x; passed as ``cache`` there it lands in ``**kwargs`` unread, and the model runs
    without the slot cache)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def step_module(model, max_batch: int, max_length: int, chunks: Sequence[int] = DEFAULT_CHUNKS,
                contexts: Sequence[int] | None = None, rows: Sequence[int] | None = None,
                check: bool = True) -> StepModule:
    """`model` (a transformers causal LM, in eval mode) as a :class:`StepModule`; its ladder is `chunks` capped
    by `max_length`, with 1 (decoding) always in it; `contexts` are its context buckets (None:
    :func:`default_contexts`; ``()``: every call reads max_length slots); `rows` its row buckets
    (None: ``DEFAULT_ROWS`` below max_batch; ``()``: every call runs max_batch rows).

    A model whose attention the step cannot reproduce is refused first, with an InputError naming the
    construct (:func:`~.step_check.refuse_unsupported`); then, with `check`, the step runs a left-padded
    two-row batch and its logits are compared with the model's own forward (:func:`~.step_check.check_step`),
    before any compile work."""
    if model.training:
        raise InputError("the model is in training mode (dropout would make each step random): call model.eval()")
    refuse_unsupported(model)
    step = StepModule(model, max_batch, max_length, chunks, contexts, rows)
    if check:
        check_step(step, eager_programs(step))
    return step


def eager_programs(step: StepModule) -> StepPrograms:
    """The step run eagerly by torch, one program per bucket (``spec.buckets()``): ``program(ids, pos, mask,
    *state)`` runs the module with `state` in place of its buffers (updated in place), returns ``(logits, state)``."""
    names = [s.name for s in step.spec.state]

    def program(input_ids, position_ids, slot_mask, *state):
        with torch.no_grad():
            if all(x is getattr(step, n) for n, x in zip(names, state)):  # its own buffers: no swapping needed
                return step(input_ids, position_ids, slot_mask), state
            logits = torch.func.functional_call(step, dict(zip(names, state)), (input_ids, position_ids, slot_mask))
        return logits, state

    return StepPrograms(step.spec, {b: program for b in step.spec.buckets()})


def export_step(step: StepModule, chunk: int) -> torch.export.ExportedProgram:
    """The chunk-`chunk` step through egraft's export (``torch.export``, then core ATen): each cache is a
    ``BUFFER_MUTATION`` output written by ``aten.scatter.src``."""
    if chunk not in step.spec.chunks:
        raise InputError(f"chunk={chunk} is not on the step's ladder {list(step.spec.chunks)}")
    return export_program(step, step.example_inputs(chunk))


def family(bucket: Bucket) -> tuple[bool | None, int]:
    """The buckets one export serves, as ``(decode, rows)``: for one row, every bucket (``decode`` None: the chunk
    symbolic from 1 up, a decode step included); for more rows, those that decode (True: chunk 1, concrete, as
    ``torch.export`` specialises a size of 1) or those that take a chunk (False: chunk > 1, symbolic).  The context
    size is symbolic in each.  Over more rows a chunk symbolic from 1 would give the decode step another graph
    than its own export (the output layer's product keeps a unit axis: the same function, a different program
    to search), so those stay apart; over one row the graphs are the same."""
    return (None, 1) if bucket.rows == 1 else (bucket.chunk == 1, bucket.rows)


class StepTracer:
    """The IR graph of each bucket of `step`, lowered from one ``torch.export`` per :func:`family`.

    The family's program is exported with its chunk (if it spans more than one) and context (if there are
    context buckets) sizes symbolic, at an example chunk over 1 where it spans one (a size of 1 would be
    specialised); ``torch.export`` proves the graph for the whole range or raises.  Each bucket's graph is that
    program lowered at the bucket's shapes (``lower_program(ep, shapes=...)``): the same graph a
    ``torch.export`` at the bucket's own sizes gives, in a tenth of a second instead of several.  When a one-row
    family's export fails it is exported again as its decode and chunk halves; when that or a bucket's
    lowering fails, the bucket is exported at its own sizes (`status` says each), so a model the symbolic
    export cannot take still compiles.  `weights`: the :class:`~egraft.frontend.weights.WeightCopies` every
    graph binds.
    """

    def __init__(self, step: StepModule, weights=None, status=lambda msg: None):
        self.step, self.weights, self.status = step, weights, status
        self.exports: dict[tuple, object] = {}  # family -> its ExportedProgram, or None after a failure
        self.export_s = 0.0  # seconds spent in the families' exports

    @staticmethod
    def _keys(bucket: Bucket) -> list[tuple]:
        """The exports that can serve `bucket`, in the order they are tried."""
        key = family(bucket)
        return [key, (bucket.chunk == 1, bucket.rows)] if key[0] is None else [key]

    def _export(self, key: tuple, bucket: Bucket):
        if key not in self.exports:
            from torch.export import Dim

            spec = self.step.spec
            # (a size held symbolic costs the export time: without context buckets every bucket reads full_context)
            context = {1: Dim("context", min=2, max=spec.full_context)} if spec.contexts else None
            over_one = [c for c in spec.chunks if c > 1]
            if key[0] is None:  # every chunk of one row: exported at the smallest chunk over 1, symbolic from 1
                example = min(over_one, default=1)
                chunk = {1: Dim("chunk", min=1, max=max(spec.chunks))} if over_one else None
            else:
                example = bucket.chunk
                chunk = None if key[0] else {1: Dim("chunk", min=2, max=max(spec.chunks))}
            what = {None: "bucket", True: "decode bucket", False: "chunk bucket"}[key[0]]
            t = time.perf_counter()
            try:
                self.exports[key] = export_program(
                    self.step, self.step.example_inputs(example, bucket.context, bucket.rows),
                    dynamic_shapes=(chunk, chunk, context))
            except EgraftError as e:
                then = ("exporting decode and chunk buckets apart" if key[0] is None
                        else "exporting each at its own sizes")
                self.status(f"one export for every {what} of {bucket.rows} row(s) failed "
                            f"({str(e).splitlines()[0]}); {then}")
                self.exports[key] = None
            self.export_s += time.perf_counter() - t
        return self.exports[key]

    def export(self, bucket: Bucket):
        """The symbolic program that serves `bucket` (exported on first use); None when each export failed."""
        for key in self._keys(bucket):
            ep = self._export(key, bucket)
            if ep is not None:
                return ep
        return None

    def __call__(self, bucket: Bucket):
        """The IR graph of `bucket` (``example_inputs(*bucket)``'s shapes)."""
        args = self.step.example_inputs(*bucket)
        keys = self._keys(bucket)
        for key in keys:
            ep = self._export(key, bucket)
            if ep is None:
                continue
            try:
                return lower_program(ep, self.weights, shapes=[a.shape for a in args])
            except EgraftError as e:
                self.status(f"lowering the shared export at {bucket} failed ({str(e).splitlines()[0]}); "
                            + ("trying its decode or chunk export" if key != keys[-1]
                               else "exporting it at its own sizes"))
        return lower_program(export_program(self.step, args), self.weights)


__all__ = ["DEFAULT_CHUNKS", "DEFAULT_ROWS", "FIRST_CONTEXT", "MIN_CONTEXT_SAVING", "StepModule", "StepTracer",
           "check_step", "default_contexts", "eager_programs", "export_step", "family", "generation_defaults",
           "refuse_unsupported", "step_module"]
