"""Products against a stored weight as generated CPU code, called from XLA through its FFI.

Decode reads every weight once per step, so its speed is the weight bytes
over the memory bandwidth.  XLA's CPU dot reads a float32 weight near that
bound, but with bfloat16 weights it takes a slow path: one row against a
14592 x 896 weight took 23-24 ms where the float32 dot took 1.3 ms (jax
0.10.2, one core of an AMD EPYC with AVX-512 and bf16 instructions).  This
module generates the product ``x [M, K] float32 @ W`` for a weight held in
the panel layout of ``backends.jax.panels`` (``[J, K, w]``: ``J`` panels of
``w`` columns, contiguous) in its stored dtype: each step of the loop over
``K`` loads one panel row of ``w`` values, widens it to float32 in registers
(bfloat16: the 16 bits shifted into the high half of a float32, exact;
float16: the hardware conversion, exact) and adds ``x[m, k]`` times it into
``w`` float32 accumulators per row, for up to four rows at a time.  The sums
are float32 dot products over ``K``, as the float32 dot's are, up to the
order of summation.

The code is LLVM IR written here as text and compiled by LLVM through
``llvmlite`` (numba's JIT layer, a compiled wheel) for the host CPU's own
instruction set, once per shape and dtype (about 50 ms each); the object code is kept in egraft's cache directory
(``<cache root>/llvm``, keyed by the IR, the CPU and the LLVM version) so a later process reads it back, and an
artifact saved with its executables keeps it too (``runtime.bundled``: :func:`offer`).  XLA
calls it through a typed FFI handler (``jax.ffi``): the handler reads the
two operand buffers and the result buffer from XLA's call frame (the layout
of ``xla/ffi/api/c_api.h``, shipped with jaxlib) and answers XLA's metadata
query with the FFI version of that header.  Measured (one pinned core, the
same host, twelve 14592 x 896 weights read in turn, so nothing stays in
cache): bfloat16 weights 0.72 ms per weight at one row, where XLA's float32
dot of the same weights in float32 took 1.67 ms; at four rows 0.85 against
2.38 ms.  Whether a program uses it is a search knob (``stream`` of the JAX
backend), timed on the machine, never assumed.

On more than one core the product is shared with helper threads of the
process (``runtime.llvm_pool``, as many as XLA's CPU pool has threads, less
the caller): the caller and the helpers claim panels one at a time from a
job on the caller's stack; the caller never waits for a helper to start,
only for those that joined to finish, so a late helper finds nothing left
and no schedule can deadlock.  Each panel is computed by one thread in one
order, so the values do not depend on the thread count.  Pinned to one core
(XLA sizes its pool from the CPU affinity) the caller computes every panel
itself and no helper is started.

A program that calls one of these kernels names it in its custom call
(:attr:`KernelSpec.name`); a saved program lists its specs in its manifest
and :func:`ensure` compiles and registers them before XLA compiles or reads
back the program.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import threading
from dataclasses import dataclass

from ..env import flag
from . import llvm_pool
from .llvm_ir import WIDEN, WIDTHS, KernelSpec, module_ir


def available() -> bool:
    """Whether this process can generate these kernels (llvmlite importable, a jax with the typed FFI)."""
    if not flag("EGRAFT_LLVM_KERNELS", True):
        return False
    try:
        import jax.ffi  # noqa: F401
        import llvmlite.binding  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# compiling and registering

@dataclass(frozen=True)
class _Made:
    """A compiled kernel, alive for the process (XLA keeps the handler's address once registered)."""

    engine: object
    module: object
    handler: object  # the ctypes function of @handler


_LOCK = threading.Lock()
_MADE: dict[KernelSpec, _Made] = {}
_REGISTERED: set[KernelSpec] = set()  # registered with XLA's CPU client


@functools.lru_cache(maxsize=1)
def _target_machine():
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                        opt=3, codemodel="jitdefault")


_OBJECTS: dict[str, bytes] = {}  # object code this process compiled or read back, by object_key (for artifacts)
_OFFERED: dict[str, bytes] = {}  # object code an artifact keeps (runtime.bundled), by key: used instead of compiling
STATS = {"compiled": 0, "cached": 0, "kept": 0}  # where this process's kernels' machine code came from


def _key(ir: str) -> str:
    """What the machine code of `ir` depends on: the IR, this CPU (name and features) and LLVM's version."""
    import llvmlite
    import llvmlite.binding as llvm

    return hashlib.sha256("\0".join([ir, llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(),
                                      llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info))])
                          .encode()).hexdigest()


def object_key(spec: KernelSpec) -> str:
    """The key under which `spec`'s machine code for this CPU is kept (the cache's file name, an artifact's entry)."""
    return _key(module_ir(spec))


def _object_path(key: str) -> str | None:
    """Where the machine code of key `key` is kept between processes (None: no cache)."""
    from .xla_cache import cache_root, caching

    if not caching():
        return None
    return str(cache_root() / "llvm" / f"{key}.o")


def object_code(spec: KernelSpec) -> tuple[str, bytes]:
    """(:func:`object_key`, machine code) of `spec` for this CPU, as this process compiled or read it (compiled
    here if not yet)."""
    _made(spec)
    key = object_key(spec)
    return key, _OBJECTS[key]


def offer(key: str, obj: bytes) -> None:
    """Machine code an artifact keeps for the kernel of key `key` (``object_key``): a kernel of that key is made
    from it instead of compiled.  The key names the IR, the CPU and LLVM, so other hosts' code is never used."""
    if obj:
        _OFFERED[key] = bytes(obj)


def _read_object(path: str | None) -> bytes | None:
    """The kept object code, or None when there is none or its checksum does not match (it is then rebuilt)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (OSError, TypeError):
        return None
    digest, obj = data[:32], data[32:]
    return obj if obj and hashlib.sha256(obj).digest() == digest else None


def _keep_object(path: str | None, obj: bytes) -> None:
    """Write the object code for the next process; a cache that cannot be written costs only the next compile."""
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as f:
            f.write(hashlib.sha256(obj).digest() + obj)
        os.replace(tmp, path)
    except OSError:
        pass


def _compile(spec: KernelSpec):
    """The kernel's module, optimised (-O3) and compiled for the host CPU, or read back as object code that an
    earlier process compiled from the same IR for the same CPU (``<cache root>/llvm``)."""
    import llvmlite.binding as llvm

    tm = _target_machine()
    llvm_pool.ensure(tm)  # (the products' modules link against the pool's entry point)
    ir = module_ir(spec)
    mod = llvm.parse_assembly(ir)
    mod.verify()
    key = _key(ir)
    path = _object_path(key)
    kept, source = _OFFERED.get(key), "kept"
    if kept is None:
        kept, source = _read_object(path), "cached"
    if kept is None:
        source = "compiled"
        pb = llvm.create_pass_builder(tm, llvm.PipelineTuningOptions(speed_level=3))
        pb.getModulePassManager().run(mod, pb)
    else:
        _OBJECTS[key] = kept

    def notify(_m, obj, key=key, path=path):
        _OBJECTS[key] = bytes(obj)
        _keep_object(path, _OBJECTS[key])

    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.set_object_cache(notify, lambda _m: kept)
    engine.finalize_object()
    STATS[source] += 1
    return engine, mod


def compiled(spec: KernelSpec):
    """``product(x, panels, out, scales=None)`` for `spec` as a function of addresses (tests, benchmarks;
    `scales`: an int4 product's)."""
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
        _made(spec).engine.get_function_address("product"))
    return lambda x, panels, out, scales=None: fn(x, panels, out, scales)


def _made(spec: KernelSpec) -> _Made:
    with _LOCK:
        if spec not in _MADE:
            engine, mod = _compile(spec)
            handler = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(engine.get_function_address("handler"))
            _MADE[spec] = _Made(engine, mod, handler)
        return _MADE[spec]


def ensure(spec: KernelSpec) -> str:
    """Compile `spec` and register it with XLA's CPU client once per process; returns its custom call name."""
    import jax.ffi

    made = _made(spec)
    with _LOCK:
        if spec not in _REGISTERED:
            jax.ffi.register_ffi_target(spec.name, jax.ffi.pycapsule(made.handler), platform="cpu")
            _REGISTERED.add(spec)
    return spec.name


def call(spec: KernelSpec, x, panels, scales=None):
    """Inside a traced JAX function: ``x [rows, k] float32`` times `panels` ``[panels, k, width]`` of the spec's
    dtype (int4: the packed rows, and their `scales`; other layouts: the operand W is read from), as ``[rows,
    panels * width]`` float32 through the registered kernel (a batch: x and the result ``[batch * rows, ..]``)."""
    import jax
    import jax.numpy as jnp

    name = ensure(spec)
    out = jax.ShapeDtypeStruct((spec.batch * spec.rows, spec.panels * spec.width), jnp.float32)
    return jax.ffi.ffi_call(name, out)(x, panels, *(() if scales is None else (scales,)))


__all__ = ["KernelSpec", "STATS", "WIDEN", "WIDTHS", "available", "call", "compiled", "ensure", "module_ir",
           "object_code", "object_key", "offer"]
