"""``egraft.compile``: a model in, a :class:`CompiledModel` (an ``nn.Module``) out.

A compiled model keeps one program per input signature, as ``torch.compile``
does: with ``example_inputs`` the first is compiled at once, any other
signature on its first call (:mod:`.pipeline` says what compiling one
involves).  A call costs one tuple of (shape, dtype, device) per input and
one dict lookup more than the executable's own call, and with a single
signature not even that (:meth:`CompiledModel._set_fast`): nothing is
checked per call that was checked when the signature was compiled.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path

import torch

from ..errors import ArtifactError, BackendError, InputError
from ..frontend.adopt import adopt
from ..frontend.quality import measure_lossy
from ..frontend.quantize import LOSSY, check_mode
from ..frontend.quantize import quantize as quantize_model
from ..measure import parse, require
from ..runtime.outputs import rebuild
from ..search.config import CompileConfig
from .pipeline import _TORCH_DTYPES, CompiledProgram, build, call_key, check_call, flat_inputs
from ..runtime.sampling import UNSET  # an option generate() is not given: the generation_config value applies


class CompiledModel(torch.nn.Module):
    """A model with its forward pass compiled by egraft, one program per input signature.

    Call it like the model: torch tensors in, the model's own output
    structure out (a tensor, tuple, list or dict; a Hugging Face
    ``ModelOutput`` comes back as a dict of its non-None fields), on the
    inputs' device.  Compiled programs are inference programs: the weights
    are frozen at compile time (changing the wrapped model's parameters
    afterwards does not change them) and no gradients flow through them.

    ``executables`` / ``results`` map each signature name (``"4x32:float32"``)
    to its :class:`~egraft.backends.Executable` / search result;
    :meth:`measure` times it against eager PyTorch and torch.compile;
    :meth:`report` says what was done (and what was measured); :meth:`save`
    writes an artifact for :func:`egraft.load`.
    """

    def __init__(self, model: torch.nn.Module, config: CompileConfig):
        super().__init__()
        self.model = model  # a reference, registered as a submodule: no weights are copied here
        self.config = config
        self._programs: dict[tuple, CompiledProgram] = {}
        # one copy of each weight for every signature's program (a parameter updated in place in between
        # gets a fresh copy: frontend.weights.WeightCopies), and the forms derived from it made once
        from ..frontend.weights import WeightCopies

        self._weights = WeightCopies()
        self._fast = None  # see _set_fast
        self._fast_rebuild = None
        self._status = _status_printer(config.progress)
        self.generation = None  # an egraft.api.generation.Generation when compiled with max_batch / max_length
        self.quantization = None  # frontend.quantize.quantize's report when compiled with quantize=

    # --- the call path --------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        if kwargs:
            return self._call_with_kwargs(args, kwargs)
        fast = self._fast
        # one signature compiled: the executable's own fast path checks the inputs fit it (torch in, torch out)
        if fast is not None and args and args[0].__class__ is torch.Tensor:
            out = fast(args)
            if out is not None:
                return self._fast_rebuild(out)
        try:
            key = (tuple([(a.shape, _TORCH_DTYPES[a.dtype]) for a in args]), tuple([a.device for a in args]))
        except (AttributeError, KeyError):
            key = None  # a non-tensor input or a dtype egraft does not compile: compile_for explains
        prog = self._programs.get(key)
        if prog is None:
            prog = self.compile_for(*args)
        return prog.call(*args)

    def _call_with_kwargs(self, args: tuple, kwargs: dict):
        try:
            key = call_key(args, kwargs)
        except (AttributeError, KeyError):
            key = None  # compile_for explains
        prog = self._programs.get(key)
        if prog is None:
            prog = self.compile_for(*args, **kwargs)
        return prog.call(*flat_inputs(args, kwargs, prog.kwarg_order))

    def compile_for(self, *args, **kwargs) -> CompiledProgram:
        """Compile the signature of these inputs now (a call does this on a signature's first use)."""
        try:
            key = call_key(args, kwargs)
        except (AttributeError, KeyError):
            check_call(self.model, args, kwargs)  # names the input that is not a tensor or has a dtype egraft lacks
            raise InputError("these inputs cannot be compiled; pass torch tensors of the dtypes egraft compiles "
                             "positionally") from None
        if key not in self._programs:
            full = self.config.no_room(self._programs, key, "input signatures")
            if full:
                raise InputError(f"{full}; pass max_shapes=N to egraft.compile for more")
            self._programs[key] = build(self.model, tuple(args), dict(kwargs), key, self.config, self._status,
                                        weights=self._weights)
            self._set_fast()
        return self._programs[key]

    def _set_fast(self) -> None:
        """With exactly one positional-only signature, calls first try its executable's precomputed path.

        That path (the runner's, ``runtime.jax_fast_path`` for JAX, ``runtime.torch_runner`` for torch)
        returns None unless the inputs are exactly the ones it was compiled for
        (shapes, dtypes, devices), so nothing is looked up per call. With
        several signatures a miss would cost a rejected call, so the keyed
        lookup decides instead.
        """
        progs = list(self._programs.values())
        only = progs[0] if len(progs) == 1 and not progs[0].kwarg_order and not progs[0].state else None
        self._fast = only.executable.fast_path() if only is not None else None
        if self._fast is not None:
            self._fast_rebuild = functools.partial(rebuild, only.output_tree)

    def generate(self, input_ids, attention_mask=None, *, max_new_tokens: int, do_sample=UNSET,
                 temperature=UNSET, top_k=UNSET, top_p=UNSET, eos_token_id=UNSET,
                 pad_token_id=UNSET, generator=None) -> torch.Tensor:
        """transformers' ``model.generate`` on the compiled step programs (greedy or multinomial sampling).

        Same argument names and output as transformers: int64 ``[batch,
        prompt_length + new]``, the (left padded) prompt then the new tokens.
        Options left out take the model's ``generation_config`` values; an
        explicit None turns one off.  Needs ``max_batch`` and ``max_length``
        at ``egraft.compile``; a longer request or a larger batch is refused
        with the limit named before anything runs.
        """
        if self.generation is None:
            raise InputError(f"{type(self.model).__name__} was compiled for single forward passes; pass max_batch=... "
                             "and max_length=... to egraft.compile to compile generation")
        return self.generation.generate(input_ids, attention_mask, max_new_tokens=max_new_tokens,
                                        do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                                        eos_token_id=eos_token_id, pad_token_id=pad_token_id, generator=generator)

    # --- what was compiled ----------------------------------------------------------------------

    @property
    def programs(self) -> dict[str, CompiledProgram]:
        """Signature name -> :class:`~egraft.api.pipeline.CompiledProgram`, in compile order."""
        return {p.name: p for p in self._programs.values()}

    @property
    def executables(self) -> dict:
        return {p.name: p.executable for p in self._programs.values()}

    @property
    def results(self) -> dict:
        return {p.name: p.result for p in self._programs.values()}

    def _program(self, signature: str | None) -> CompiledProgram:
        progs = self.programs
        if not progs:
            raise InputError("nothing is compiled yet: pass example_inputs to egraft.compile or call the model once")
        if signature is None:
            if len(progs) > 1:
                raise InputError(f"{len(progs)} signatures are compiled ({', '.join(progs)}); name one with "
                                 "signature=...")
            return next(iter(progs.values()))
        if signature not in progs:
            raise InputError(f"no compiled signature {signature!r}; compiled: {', '.join(progs)}")
        return progs[signature]

    def measure(self, signature: str | None = None, inductor: bool = True) -> dict:
        """Time the compiled program against eager PyTorch (and torch.compile unless ``inductor=False``).

        The measurement (:func:`egraft.measure.compare_model`: pinned,
        interleaved, the medians' ~95 % intervals) runs on the fresh random
        input set of the signature (one signature compiled, or ``signature=``
        naming one) and is kept, so :meth:`report` shows it; returns its
        record.  Measuring again replaces it.
        """
        from ..measure import compare_model

        p = self._program(signature)
        self._status(f"timing {p.name} against eager PyTorch" + (" and torch.compile" if inductor else ""))
        p.comparison = compare_model(self, self.model, p.example, self.config.device, inductor=inductor)
        return p.comparison

    def report(self, fmt: str = "text", signature: str | None = None):
        """What was traced, searched, chosen, checked and measured: a string (``"text"``) or a dict (``"json"``).

        Only reports: nothing is run or changed.  The speed-ups are those of
        the last :meth:`measure` (or "not measured").
        """
        from .report import json_report, text_report

        if fmt not in ("text", "json"):
            raise InputError(f"unknown report format {fmt!r}; use 'text' or 'json'")
        progs = [self._program(signature)] if signature is not None else list(self._programs.values())
        if not progs:
            self._program(None)  # raises: nothing compiled
        doc = json_report(self, progs)
        return doc if fmt == "json" else text_report(doc)

    def save(self, directory: str | os.PathLike, signature: str | None = None, *,
             keep_executables: bool = False) -> str:
        """Write the compiled program as an artifact directory for :func:`egraft.load`; returns its path.

        With one signature compiled (or ``signature=`` naming one) the
        artifact is `directory` itself.  With several and no ``signature``,
        each goes to its own subdirectory ``directory/<signature>/`` (the
        name made file-safe) and `directory` is returned.

        `keep_executables`: also compile each JAX CPU program (in a new process, about as long as a first
        load's compile) and keep what XLA made, and the generated CPU kernels' machine code, in the artifact,
        so that the first load on a host like this one reads them instead of compiling
        (``egraft.runtime.bundled``).
        """
        path = self._save(directory, signature)
        if keep_executables:
            from ..runtime.bundled import keep

            keep(path)
        return path

    def _save(self, directory, signature) -> str:
        from ..backends.artifact import save_artifact

        if self.generation is not None and signature is None:
            from .generation_artifact import save_generation

            return save_generation(self.generation, str(directory), model=type(self.model).__name__)
        if not self._programs:
            raise ArtifactError("nothing to save: nothing is compiled yet; pass example_inputs to egraft.compile "
                                "or call the model once before save()")
        if signature is not None or len(self._programs) == 1:
            p = self._program(signature)
            return save_artifact(p.executable, str(directory), meta=self._meta(p))
        root = Path(directory)
        for p in self._programs.values():
            save_artifact(p.executable, str(root / safe_name(p.name)), meta=self._meta(p))
        return str(root)

    def _meta(self, p: CompiledProgram) -> dict:
        from .report import json_report

        return {"input_names": list(p.input_names), "output_tree": p.output_tree,
                "model": type(self.model).__name__, "report": json_report(self, [p]),
                **({"quantization": dict(self.quantization)} if self.quantization else {})}

    def extra_repr(self) -> str:
        return f"device={self.config.device!r}, signatures={list(self.programs)}"


def safe_name(name: str) -> str:
    """A signature name as a directory name: letters, digits, 'x', '.', '_' and '-' only."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "signature"


def _status_printer(progress):
    """A one-line status per stage: on a terminal (progress=None) or when asked (progress=True)."""
    on = progress is True or (progress is None and _isatty(sys.stderr))
    if not on:
        return lambda msg: None
    from rich.console import Console

    console = Console(file=sys.stderr, force_terminal=progress is True or None)
    return lambda msg: console.print(f"[dim]egraft:[/dim] {msg}", highlight=False)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # noqa: BLE001 - a closed or fake stream is not a terminal
        return False


def compile(model, device: str = "cpu", example_inputs=None, backend: str = "auto", budget=None, *,  # noqa: A001
            example_kwargs: dict | None = None, max_batch: int | None = None, max_length: int | None = None,
            chunks=None, contexts=None, rows=None, quantize: str | None = None, group_size: int | None = None,
            **options) -> CompiledModel:
    """Compile `model`'s forward pass with egraft; see docs/compile.md.

    `example_inputs`: a tensor or a tuple of tensors (and `example_kwargs`,
    tensors or python values): compile that signature now; without them the
    first call compiles.  `device`: ``"cpu"``, ``"cuda"``, ``"cuda:N"``,
    ``"tpu"``.  `backend`: ``"auto"`` (the search picks among those that run
    on the device) or a registered backend (``"jax"``, ``"torch"``,
    ``"triton"``, ...).  `budget` and the keyword `options` (``fitness``,
    ``rules``, ``limits``, ``seed``, ``cache``, ``validate``, ``max_shapes``,
    ``progress``, ...) are the fields of
    :class:`egraft.search.config.CompileConfig`, parsed by it: a misspelt
    one is an error naming them all.

    `max_batch` and `max_length` (both, for a transformers causal LM):
    compile generation now: one program per bucket (chunk size, cache slots
    read, rows computed; :mod:`egraft.api.generation`) over the prompt chunk
    sizes `chunks` (default 1, 4, 16, 64, 256, capped by `max_length`), the
    context buckets `contexts` (slots a call reads: the decode step reads each,
    a prompt chunk of T the smallest of at least 2 T; default 128, 256, ... up
    to half of `max_length`; ``()``: none) and the row buckets `rows` (default 1
    below `max_batch`: a batch of one sequence computes one row, prompt and
    decode; ``()``: none), for :meth:`CompiledModel.generate`.

    `quantize`: ``"int8"`` compiles the model with its linear layers' weights
    as int8, one scale per output channel, ``"int4"`` as int4 in groups of
    `group_size` (32, 64, 128; default 128) input columns, one scale each
    (:mod:`egraft.frontend.quantize`; the model itself is left as it is); the
    compiled programs equal that quantised model (``cm.model``), the model
    with each weight replaced by its dequantised values.  A model quantised
    with torchao's weight-only int8 or int4 configs compiles as it is (its
    layers read as egraft's own: :mod:`egraft.frontend.adopt`, which names
    what it refuses).  ``"w8a8"`` (lossy, opt-in) also rounds each layer's
    input to int8, one scale per row, so its products are integer dot
    products: the compiled programs equal that model within a stated lossy
    bound, and its logit error and top-1 agreement against the float model
    are measured and reported (:mod:`egraft.frontend.quality`).
    """
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"egraft.compile takes a torch.nn.Module, got {type(model).__name__}; wrap a function "
                         "in an nn.Module whose forward calls it")
    dev = parse(device)  # an unknown device string: BackendError naming the forms
    require(dev)
    config = CompileConfig.parse(options, where="egraft.compile", device=str(dev), backend=backend, budget=budget)
    if backend != "auto":
        from ..backends import get_backend

        b = get_backend(backend)  # an unknown name raises BackendError listing the known ones
        if dev.kind not in b.devices:
            raise BackendError(f"backend {backend!r} does not run on {str(dev)!r}; it runs on {', '.join(b.devices)}")
    mode = check_mode(quantize, group_size)  # an unknown mode or group size: InputError before any work
    model.eval()
    # torchao's weight-only layers as egraft's own; another library's: InputError naming the layer
    model, quantization = adopt(model)
    if mode is not None:
        if quantization is not None:
            raise InputError(f"quantize={mode!r}: {type(model).__name__} is quantised already ("
                             f"{quantization['source']}, {quantization['layers']} layers); compile it with quantize=None")
        float_model = model
        model, quantization = quantize_model(model, mode, group_size)
    cm = CompiledModel(model, config)
    cm.quantization = quantization
    if mode in LOSSY:  # how far it moves from the float model: measured, recorded, named (frontend.quality)
        quality = measure_lossy(float_model, model, cm._status)
        if quality is not None:
            quantization["quality"] = quality
    if (max_batch is None) != (max_length is None):
        raise InputError("generation needs both max_batch and max_length (the KV caches' rows and length); "
                         f"got max_batch={max_batch!r}, max_length={max_length!r}")
    if max_batch is not None:
        from .generation import compile_generation

        cm.generation = compile_generation(model, config, cm._status, max_batch=max_batch, max_length=max_length,
                                           chunks=chunks, contexts=contexts, rows=rows)
        cm.generation.quantization = quantization
    elif chunks is not None or contexts is not None or rows is not None:
        raise InputError("chunks=, contexts= and rows= describe generation: pass them with max_batch and max_length")
    if example_inputs is not None or example_kwargs:
        args = example_inputs if example_inputs is not None else ()
        if isinstance(args, torch.Tensor):
            args = (args,)
        if not isinstance(args, (tuple, list)):
            raise InputError(f"example_inputs must be a tensor or a tuple of tensors, got {type(args).__name__}")
        cm.compile_for(*args, **(example_kwargs or {}))
    return cm
