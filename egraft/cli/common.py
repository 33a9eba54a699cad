"""What the verbs share: input specs, loading a user's model, random inputs, output comparison, progress.

Random inputs and the comparison are egraft's one policy and one check
(:func:`egraft.measure.from_specs`, :func:`egraft.measure.check.outputs`);
this module only chooses what the command line needs of them.

A model on the command line is one of three things, told apart by the text:

* a workload name from ``egraft models`` (no colon): built at its ``tiny``
  size, with the workload's own example inputs;
* ``package.module:factory``: an importable module and a callable in it;
* ``path/to/file.py:factory``: a Python file, loaded by path.

The factory returns the model, or ``(model, example_inputs)``; ``--input``
specs, when given, replace the factory's inputs (so one factory serves
several shapes).  Random inputs are never all zero (a zero input hides a
wrong program): floats are standard normal, integers uniform in
``[0, int_high)`` (token ids must be valid indices, and the vocabulary size
is not known from outside the model; 100 by default, ``--int-high`` to change
it), bools random.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ..errors import EgraftError

INT_HIGH = 100  # default exclusive upper bound of random integer inputs (token ids)


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]
    dtype: str


def parse_input_spec(text: str) -> tuple[tuple[int, ...], str]:
    """'2x8x64:float32' (or '2,8,64:float32'; dtype defaults to float32) -> (shape, dtype)."""
    from ..ir import dtypes

    shape_s, _, dtype = text.partition(":")
    dtype = dtype or "float32"
    try:
        shape = tuple(int(p) for p in shape_s.replace(",", "x").split("x") if p)
    except ValueError:
        raise EgraftError(f"bad --input {text!r}: write SHAPE:DTYPE, e.g. 2x8x64:float32") from None
    if any(d < 0 for d in shape):
        raise EgraftError(f"bad --input {text!r}: dimensions must be >= 0")
    try:
        dtypes.check(dtype)
    except Exception:  # noqa: BLE001 - the IR's own message lists the dtypes; ours names the flag
        raise EgraftError(f"bad --input {text!r}: unknown dtype {dtype!r} (e.g. float32, float16, bfloat16, int64, "
                          "int32, bool)") from None
    return shape, dtype


def inputs_from_specs(specs: Sequence, seed: int = 0, int_high: int = INT_HIGH) -> tuple:
    """Random torch tensors for ``--input`` texts or (shape, dtype) pairs, by egraft's one random-input policy
    (:func:`egraft.measure.from_specs`: integers in [0, int_high))."""
    from ..measure import from_specs

    if int_high < 1:
        raise EgraftError(f"--int-high must be at least 1, got {int_high}")
    return from_specs([parse_input_spec(t) if isinstance(t, str) else t for t in specs], seed, int_high)


def _import_factory(spec: str):
    """The callable named by ``module:factory`` or ``path/to/file.py:factory``."""
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise EgraftError(f"cannot load {spec!r}: write MODULE:FACTORY or path/to/file.py:FACTORY")
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = os.path.abspath(target)
        if not os.path.isfile(path):
            raise EgraftError(f"cannot load {spec!r}: no file {target}")
        mod_name = "_egraft_user_" + os.path.splitext(os.path.basename(path))[0]
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise EgraftError(f"cannot load {spec!r}: {target} is not a Python file")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = module  # classes defined in the file pickle and print under this name
        sys.path.insert(0, os.path.dirname(path))  # the file's own sibling imports
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - a user's file failing to import is bad input, said in one line
            del sys.modules[mod_name]
            raise EgraftError(f"cannot load {spec!r}: importing {target} raised {type(e).__name__}: {e}") from None
        finally:
            sys.path.remove(os.path.dirname(path))
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())  # `egraft compile mymodel:build` from the model's folder
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as e:
            if e.name and target.startswith(e.name):
                raise EgraftError(f"cannot load {spec!r}: no module {e.name!r}; is it importable from here "
                                  "(installed, or in the current directory)?") from None
            raise EgraftError(f"cannot load {spec!r}: importing {target} raised {type(e).__name__}: {e}") from None
        except Exception as e:  # noqa: BLE001 - the user's module failing to import is bad input, said in one line
            raise EgraftError(f"cannot load {spec!r}: importing {target} raised {type(e).__name__}: {e}") from None
    try:
        return getattr(module, name)
    except AttributeError:
        raise EgraftError(f"cannot load {spec!r}: module {target!r} has no {name!r}") from None


def load_model(spec: str, inputs: Sequence[str] = (), seed: int = 0, int_high: int = INT_HIGH,
               need_inputs: bool = True):
    """(model in eval mode, example inputs as a tuple of tensors) for a workload name or a factory spec.

    The factory runs after ``torch.manual_seed(seed)``, so one that initialises
    its weights randomly builds the same model in ``compile`` and ``run --check``.
    With ``need_inputs=False`` the inputs may be None (the caller has its own).
    """
    import torch

    if os.path.isdir(spec):  # a Hugging Face checkpoint directory (GPTQ / AWQ ones read as egraft's own layers)
        from ..frontend.pretrained import from_pretrained

        model, example = from_pretrained(spec), None
    elif ":" not in spec:
        from ..models import MODELS

        if spec not in MODELS:
            raise EgraftError(f"unknown workload {spec!r}; `egraft models` lists them, or pass module:factory")
        w = MODELS[spec]
        model = w.build("tiny", seed=seed)
        example = tuple(w.example_inputs(model, seed=seed))
    else:
        factory = _import_factory(spec)
        if not callable(factory):
            raise EgraftError(f"{spec!r} is not callable; name a function that returns the model")
        torch.manual_seed(seed)  # a factory that draws its weights randomly builds the same model every time
        try:
            made = factory()
        except Exception as e:  # noqa: BLE001 - the user's factory failing is their input, said in one line
            raise EgraftError(f"{spec}() raised {type(e).__name__}: {e}") from None
        example = None
        if isinstance(made, (tuple, list)) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
            made, example = made
            example = (example,) if isinstance(example, torch.Tensor) else tuple(example)
        if not isinstance(made, torch.nn.Module):
            raise EgraftError(f"{spec}() returned {type(made).__name__}; it must return an nn.Module "
                              "or (nn.Module, example_inputs)")
        model = made
    if inputs:
        example = inputs_from_specs(inputs, seed, int_high)
    if example is None and need_inputs:
        raise EgraftError(f"{spec!r} gives no example inputs: pass --input SHAPE:DTYPE for each model input "
                          "(or return (model, example_inputs) from the factory)")
    return model.eval(), example


def run_model(model, inputs, int_high: int = INT_HIGH):
    """The model's outputs under ``torch.no_grad``; an out-of-range index names ``--int-high``."""
    import torch

    try:
        with torch.no_grad():
            return model(*inputs)
    except IndexError as e:
        raise EgraftError(f"the model raised IndexError ({e}) on random integer inputs drawn from [0, {int_high}): "
                          "pass --int-high N with N no larger than the index range (e.g. the vocabulary size)"
                          ) from None


def leaves(obj: Any) -> list:
    """The tensors of a model output in order: tuples and lists item by item, dicts (HF ModelOutputs too) by key.

    None is dropped: the order ``egraft.trace`` and the artifact's flat outputs use.
    """
    if obj is None:
        return []
    if hasattr(obj, "shape") and hasattr(obj, "dtype"):
        return [obj]
    if isinstance(obj, dict) or hasattr(obj, "keys"):
        return [x for k in obj.keys() for x in leaves(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [x for o in obj for x in leaves(o)]
    return []


def to_numpy(x):
    """A tensor or array as numpy (bfloat16 widened to float32), for comparison and printing."""
    from ..ir.tensors import widened

    return widened(x)


def dtype_name(x) -> str:
    from ..measure.check import dtype_name as name

    return name(x)


def compare_outputs(got: Any, want: Any) -> tuple[bool, list[str]]:
    """Whether two model outputs agree leaf by leaf, by the one check (float: the dtype's model-level
    tolerance, :data:`egraft.measure.TOLERANCE`; ints and bools exactly), with one line per output."""
    from ..measure import TOLERANCE, outputs

    g, w = leaves(got), leaves(want)
    if len(g) != len(w):
        return False, [f"{len(g)} outputs, the model returns {len(w)}"]
    floats = [to_numpy(x).dtype.kind == "f" for x in w]
    tols = [TOLERANCE.get(dtype_name(b), TOLERANCE["float32"]) if f else 0.0 for b, f in zip(w, floats)]
    c = outputs(g, w, tols)
    lines = []
    for k, (b, f, e, t) in enumerate(zip(w, floats, c.errors, c.tolerances)):
        note = next((n.split(": ", 1)[1] for n in c.notes if n.startswith((f"output {k}:", f"output {k} ("))), "")
        verdict = "ok" if e <= t else "MISMATCH"
        if f and "reference gives" not in note:
            detail = f"max relative error {e:.2e} (allowed {t:.0e})"
        else:
            detail = note or "exact match required"
        lines.append(f"output {k}: {shape_text(b.shape)}:{dtype_name(b)}  {detail} {verdict}")
    return c.ok, lines


@contextlib.contextmanager
def step(title: str, spinner: bool = True) -> Iterator[None]:
    """A spinner on a terminal (stderr) while a long step runs; then one 'title in N s' line on stderr."""
    t0 = time.perf_counter()
    status = None
    if spinner and sys.stderr.isatty():
        from rich.console import Console

        status = Console(stderr=True).status(f"{title} ...")
        status.start()
    try:
        yield
    finally:
        if status is not None:
            status.stop()
    print(f"{title} in {time.perf_counter() - t0:.2f} s", file=sys.stderr)


def shape_text(shape) -> str:
    return "x".join(str(int(d)) for d in shape) or "scalar"
