"""The JAX runner's per-call fast path: a dtype compare, the compiled call, the outputs.

``fast_call(runner)`` returns a closure ``fast(inputs) -> list | None`` with
every per-call decision taken when the runner is built; ``None`` means "not
the common case", and the caller then takes its checking path (which
explains a mismatch).  The same closure serves a compiled program
(``JaxExecutable``, ``CompiledModel``) and a loaded artifact.  The fast path
takes exactly the declared inputs, as numpy arrays, or as torch CPU tensors
when the program runs on the CPU, whose dtype the program holds unchanged
(int64 computed in int32 is range-checked on every call, so it never takes
this path).  Only dtypes are compared here: the compiled call rejects any
other shape itself (``TypeError``, then the checking path), but it would
silently cast a float64 array to float32 without x64.

Per call, beyond the bare compiled call (``bench/call_overhead.py``: jax
0.10.2, one pinned core, 16x24 float32 ``x*y``; medians):

* numpy in: ~1.7 us over ``np.asarray(jit(x, y))``: two Python frames, the
  dtype compare (~0.2 us), the output tuple.  ``np.asarray`` of each output
  (~1.6 us, paid by the bare call too once it reads the result) waits for
  the result and wraps XLA's buffer without a copy: a read-only view of a
  buffer XLA wrote for this call only (XLA copies an output that would
  alias a parameter or another output), so no output shares memory with an
  input or with another call's output.
* torch in: ~2.4 us over the same crossing done by hand,
  ``torch.from_numpy(np.array(jit(x.numpy(), y.numpy())))``.  That crossing
  itself costs ~6 us over numpy here: ``tensor.numpy()`` per input (~0.7 us,
  zero-copy) and per output a copy into a fresh writable array wrapped by
  ``torch.from_numpy``.  A torch output must be writable and its own
  memory; the zero-copy routes cost more for small outputs (DLPack export of
  an XLA buffer ~12 us; DLPack import of a tensor ~30 us), so DLPack is used
  only for outputs above ``COPY_MAX`` bytes and for bfloat16 (no numpy twin).

The compiled call is ``Compiled.__call__``'s C++ fast call when this jax has
one (``compiled._call``, made by the first call; saves a Python frame), else
the public ``Compiled.__call__``.  Weights passed as arguments cost ~0.6 us
each per call inside that call (jax 0.10.2, CPU; 50 weights: +30 us), bare
or not; the ``weights="constants"`` knob avoids it.
"""

from __future__ import annotations

import operator
import sys

import jax
import numpy as np

from ..ir import dtypes
from ..ir.tensors import torch_dtype, view_numpy

COPY_MAX = 128 * 1024  # bytes: a CPU output up to this size goes to torch as a copy, larger through DLPack
_SIG = operator.attrgetter("__class__", "shape", "dtype")
_DTYPE = operator.attrgetter("dtype")
_CONVERT_ERRORS = (RuntimeError, TypeError, ValueError)


def numpy_casts(runner) -> tuple:
    """Per output: the numpy dtype to cast the program's output to, None where it already is (a half-type
    state's bits: "bits", read as the float values they hold)."""
    avals = jax.tree_util.tree_leaves(runner.compiled.out_info)
    return tuple("bits" if b else None if np.dtype(a.dtype) == w else w
                 for a, w, b in zip(avals, runner.out_np, runner.out_bits))


def numpy_dtypes(runner):
    """The inputs' numpy dtypes (a half-type state's: its bits, int16); None when the program holds some input in
    another dtype (int64 as int32)."""
    if any(runner.narrow):
        return None
    return tuple(p if b else dtypes.to_numpy(d) for d, p, b in zip(runner.in_dtypes, runner.program_dtypes, runner.bits))


def layout(runner):
    """What the torch plan needs from the runner: input types, output avals and dtypes."""
    return list(runner.in_types), jax.tree_util.tree_leaves(runner.compiled.out_info), list(runner.out_dtypes)


def torch_plan(layout, casts):
    """What a torch call needs: (signature, bfloat16 inputs, per-output converter, outputs copied)."""
    torch = sys.modules["torch"]
    from_numpy, from_dlpack = torch.from_numpy, torch.utils.dlpack.from_dlpack
    gtypes, avals, out_dtypes = layout
    sig = tuple((torch.Tensor, tuple(s), torch_dtype(d)) for s, d in gtypes)
    bf16 = tuple(dtypes.row(d).bits is not None for _, d in gtypes)  # no numpy twin: they cross as bits
    convs, copied = [], []
    for a, cast, d in zip(avals, casts, out_dtypes):
        copy = dtypes.row(d).bits is None and int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize <= COPY_MAX
        copied.append(copy)
        if copy:  # np.array / astype: a fresh writable array, then zero-copy into torch
            convs.append((lambda o: from_numpy(np.array(o))) if cast is None else
                         (lambda o, c=cast: from_numpy(np.asarray(o).astype(c))))
        else:  # the XLA buffer itself, through DLPack
            want = torch_dtype(d)
            convs.append((lambda o: from_dlpack(o.__dlpack__())) if np.dtype(a.dtype) == dtypes.to_numpy(d)
                         else (lambda o, w=want: from_dlpack(o.__dlpack__()).to(w)))
    return sig, bf16, tuple(convs), tuple(copied)


def _torch_arrays(xs, bf16):
    """The careful conversion: detach, bfloat16 as an int16 view; None when some tensor cannot cross."""
    arrs = []
    for x, bf in zip(xs, bf16):
        if not x.is_cpu:
            return None
        if x.requires_grad:
            x = x.detach()
        try:
            arrs.append(view_numpy(x) if bf else x.numpy())
        except _CONVERT_ERRORS:  # conj/neg-bit views and the like: take the checking path
            return None
    return arrs


def _scoped(run):
    def scoped(*args):  # a program computing in 64 bits runs under x64, locally
        with jax.enable_x64(True):
            return run(*args)
    return scoped


def fast_call(runner):
    """The runner's per-call closure (see the module docstring); it holds no reference to the runner."""
    np_dts = numpy_dtypes(runner)
    casts = numpy_casts(runner)
    runner_np = tuple(runner.out_np)
    dev = runner.dev
    on_cpu = dev.platform == "cpu"
    prefix = runner.prefix
    compiled, x64 = runner.compiled, runner.x64
    # None: torch takes the checking path (state included: its new value goes back to the caller's tensor there)
    plan = layout(runner) if on_cpu and np_dts is not None and not runner.state_outputs else None
    asarray, array, ndarray = np.asarray, np.array, np.ndarray
    tensor = tensor_numpy = from_numpy = tsig = bf16 = tconvs = None
    plain_torch = False

    # every output already in its graph dtype, and none a state's new value (which stays a jax array)
    states = runner.state_outputs
    plain_np = not any(c is not None for c in casts) and not states

    def np_out(outs):
        return [o if k in states and c is None else asarray(o) if c is None else
                asarray(o).view(want) if c == "bits" else asarray(o).astype(c)
                for k, (o, c, want) in enumerate(zip(outs, casts, runner_np))]

    def first(*args):  # the first call makes the C++ fast call; later calls go straight to it
        nonlocal call
        if x64:
            with jax.enable_x64(True):
                outs = compiled(*args)
        else:
            outs = compiled(*args)
        run = getattr(compiled, "_call", None) or compiled  # jax-internal; the public call otherwise
        call = _scoped(run) if x64 else run
        return outs

    call = first

    def torch_setup():  # torch need not be imported when the executable is built
        nonlocal tensor, tensor_numpy, from_numpy, tsig, bf16, tconvs, plain_torch
        torch = sys.modules["torch"]
        tensor, tensor_numpy, from_numpy = torch.Tensor, torch.Tensor.numpy, torch.from_numpy
        tsig, bf16, tconvs, copied = torch_plan(plan, casts)
        # the common case: no bfloat16 input, every output copied out in the program's dtype
        plain_torch = not any(bf16) and all(copied) and not any(c is not None for c in casts)

    def torch_call(xs):  # the careful path: bfloat16, requires_grad, other devices, casts, DLPack
        try:
            if tuple(map(_SIG, xs)) != tsig:
                return None
        except AttributeError:
            return None
        arrs = _torch_arrays(xs, bf16)
        if arrs is None:
            return None
        return [f(o) for f, o in zip(tconvs, call(*prefix, *arrs))]

    def fast(xs):
        cls = xs[0].__class__ if xs else ndarray
        if cls is ndarray or (states and isinstance(xs[0], jax.Array)):  # (a state passed as a jax array)
            try:
                if tuple(map(_DTYPE, xs)) != np_dts:  # (JAX would cast a float64 array to float32)
                    return None
            except AttributeError:  # lists, scalars
                return None
            if not on_cpu:  # on the CPU the compiled call takes numpy directly
                xs = [jax.device_put(x, dev) for x in xs]
            try:
                outs = call(*prefix, *xs)
            except TypeError:  # a shape it was not compiled for: the checking path explains
                return None
            # read-only views of this call's own XLA buffers
            return list(map(asarray, outs)) if plain_np else np_out(outs)
        if cls is tensor:
            if plain_torch:
                try:
                    arrs = list(map(tensor_numpy, xs))  # zero-copy views of CPU tensors
                except _CONVERT_ERRORS:  # requires_grad, another device, not all tensors
                    return torch_call(xs)
                if tuple(map(_DTYPE, arrs)) != np_dts:
                    return None
                try:
                    outs = call(*prefix, *arrs)
                except TypeError:  # a wrong shape
                    return None
                # a fresh writable copy of each output, wrapped by torch (map: no Python frame per output)
                return list(map(from_numpy, map(array, outs)))
            return torch_call(xs)
        if tensor is None and plan is not None and "torch" in sys.modules \
                and isinstance(xs[0], sys.modules["torch"].Tensor):
            torch_setup()
            return fast(xs)
        return None

    fast.np_dtypes = np_dts
    return fast
