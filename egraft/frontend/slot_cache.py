"""The generation step's slot cache as transformers sees it: its cache layers and its attention masks.

:func:`slot_layer_class` is the ``transformers.cache_utils`` cache layer of
the step (``frontend.causal_lm``): ``update`` scatters the new tokens' K and V
to the slots their positions name and returns the slots the call reads.
:class:`SlotMasks` makes every 4-D attention mask the model builds through
transformers' ``masking_utils`` while a step runs (see the comment above it).
"""

from __future__ import annotations

import threading

import torch

from ..errors import InputError


def slot_layer_class():
    """The step's cache layer class (a ``transformers.cache_utils.CacheLayerMixin``; defined on first use, so this
    module imports no transformers)."""
    from transformers.cache_utils import CacheLayerMixin

    class SlotLayer(CacheLayerMixin):
        """One layer's K and V caches; ``update`` scatters the new tokens to their slots and returns the slots
        the call reads."""

        is_sliding = False  # one layer kind for every layer: the masks carry the windows (SlotMasks)

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, context: int):
            super().__init__()
            self.keys, self.values, self.slots, self.context = keys, values, slots, context
            self.is_initialized = True

        def lazy_initialization(self, key_states, value_states) -> None:
            return None

        def update(self, key_states, value_states, *args, **kwargs):
            b, h, t, d = key_states.shape
            rows, length = self.keys.shape[0], self.keys.shape[2]
            slots, ks, vs = self.slots, key_states.to(self.keys.dtype), value_states.to(self.values.dtype)
            if b < rows:
                # a row bucket: the call holds rows 0..b-1; the others' rows of the update go to the scratch tail
                # (slots past max_length, never read), so one scatter still covers every row, as Scatter requires
                tail = torch.arange(length - t, length, device=slots.device)[None, :].expand(rows - b, t)
                slots = torch.cat([slots, tail], 0)
                ks = torch.cat([ks, ks.new_zeros(rows - b, h, t, d)], 0)
                vs = torch.cat([vs, vs.new_zeros(rows - b, h, t, d)], 0)
            idx = slots[:, None, :, None].expand(rows, h, t, d)
            self.keys.scatter_(2, idx, ks)
            self.values.scatter_(2, idx, vs)
            c = self.context  # the slots the call reads: a prefix of the cache (max_length of them, or a bucket's)
            return self.keys[:b, :, :c], self.values[:b, :, :c]

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.context, 0

        def get_seq_length(self) -> int:
            """``context - T``: rows differ, so there is no one count of cached tokens; this is the one that keeps
            transformers' invariant ``past + T == keys returned`` (the 2-D mask the step hands the model is
            ``context`` wide).  The step passes position_ids and builds every mask itself, so a model reads it
            only for sizes (MPT's ALiBi slice, Bloom's key length); a model that derived positions from it would
            fail the step's check against the model's own forward (:func:`~egraft.frontend.step_check.check_step`)."""
            return self.context - self.slots.shape[1]

        def get_max_length(self) -> int:
            return self.keys.shape[2]

    return SlotLayer


# --- the step's attention masks -------------------------------------------------------------------------------------
# transformers (5.x) models build their masks with masking_utils' create_causal_mask /
# create_sliding_window_causal_mask / create_chunked_causal_mask: each combines a mask function of (batch, head,
# query index, key index) -- causal, a sliding window, chunks -- with the 2-D padding mask, and hands it to the mask
# interface of the model's attention implementation (masking_utils.ALL_MASK_ATTENTION_FUNCTIONS["sdpa" / "eager"]).
# The step hands the model its slot mask as that 2-D mask, and while a step runs the interface is SlotMasks.mask
# (in the thread running the step; other threads keep transformers' own): it evaluates the model's own mask function
# at each query's POSITION (position_ids, not the chunk column) and each key's slot (= its position), so a sliding
# window or a chunk follows every row's own positions.  Outside a step the interfaces are transformers' own.

_ACTIVE = threading.local()  # .call: the running step's SlotMasks in this thread (None outside a step)
MASK_IMPLEMENTATIONS = ("sdpa", "eager")  # the attention implementations whose masks are dense tensors
_HOOK = {"users": 0, "saved": {}}  # steps running (all threads) while the interfaces are hooked; what they replaced
_HOOK_LOCK = threading.Lock()
_MISSING = object()


def _hook_interfaces() -> None:
    """Route transformers' sdpa / eager mask interfaces through the running step (first step in: install)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS as interfaces

    with _HOOK_LOCK:
        if _HOOK["users"] == 0:
            for name in MASK_IMPLEMENTATIONS:
                _HOOK["saved"][name] = interfaces._local_mapping.get(name, _MISSING)
                own = interfaces[name]

                def hooked(*args, _own=own, **kwargs):
                    call = getattr(_ACTIVE, "call", None)
                    return _own(*args, **kwargs) if call is None else call.mask(*args, **kwargs)

                interfaces[name] = hooked  # the interface's own mapping: transformers' hook for an override
        _HOOK["users"] += 1


def _unhook_interfaces() -> None:
    """The last step out puts transformers' interfaces back as they were."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS as interfaces

    with _HOOK_LOCK:
        _HOOK["users"] -= 1
        if _HOOK["users"] == 0:
            for name, saved in _HOOK["saved"].items():
                if saved is _MISSING:
                    interfaces._local_mapping.pop(name, None)
                else:
                    interfaces[name] = saved
            _HOOK["saved"].clear()


class SlotMasks:
    """One step call's mask context: its positions and slots, and how many masks the model built through it."""

    def __init__(self, position_ids: torch.Tensor, slots: torch.Tensor):
        self.position_ids, self.slots, self.built = position_ids, slots, 0

    def __enter__(self):
        _hook_interfaces()
        self.outer = getattr(_ACTIVE, "call", None)
        _ACTIVE.call = self
        return self

    def __exit__(self, *exc):
        _ACTIVE.call = self.outer
        _unhook_interfaces()

    def mask(self, batch_size, q_length, kv_length, kv_offset=0, mask_function=None, attention_mask=None,
             dtype=torch.float32, use_vmap=False, **kwargs):
        """The additive mask ``[r, 1, T, C]``: 0 where the model's mask function allows the key at its query's
        position and the slot holds a token (`attention_mask`, the step's slot mask), else ``finfo.min`` (so a
        filler row with no token to read stays finite)."""
        pos = self.position_ids
        r, t = pos.shape
        if (batch_size, q_length, kv_length, kv_offset) != (r, t, self.slots.shape[0], 0):
            raise InputError(f"the model asked for an attention mask of {batch_size} rows x {q_length} queries x "
                             f"{kv_length} keys (offset {kv_offset}); the step's call is {r} x {t} x "
                             f"{self.slots.shape[0]} slots: it sizes its attention some other way than by the cache")
        if use_vmap:  # or_mask_function / and_mask_function: a pattern of the model's own, not index-based
            raise InputError("the model overlays its own mask function on the causal mask (masking_utils' "
                             "or_mask_function / and_mask_function, e.g. bidirectional image tokens); egraft's "
                             "slot-cache step reproduces only the index-based causal, sliding-window and chunked "
                             "masks")
        if mask_function is None:  # an interface called without one: transformers' default, causal
            from transformers.masking_utils import causal_mask_function as mask_function
        rows = torch.arange(r, device=pos.device)[:, None, None, None]
        heads = torch.zeros(1, dtype=torch.int64, device=pos.device)[None, :, None, None]
        allowed = mask_function(rows, heads, pos[:, None, :, None], self.slots[None, None, None, :])
        if attention_mask is not None:
            allowed = allowed & attention_mask[:, None, None, :].to(torch.bool)
        allowed = allowed.expand(r, 1, t, self.slots.shape[0])
        zero = torch.zeros((), dtype=dtype, device=pos.device)
        self.built += 1
        return torch.where(allowed, zero, torch.finfo(dtype).min)


__all__ = ["MASK_IMPLEMENTATIONS", "SlotMasks", "slot_layer_class"]
