"""The ``vllm.general_plugins`` hook: egraft's backend name and saved artifacts, in every vLLM process.

vLLM calls each general plugin's function once per process it starts
(engine, workers) before it builds the model.  :func:`register` does two
things there, neither of which imports vLLM (this module must import and run
where vLLM is absent):

1. Makes sure the TorchDynamo backend name ``egraft`` resolves, so vLLM's
   ``compilation_config={"backend": "egraft"}`` finds it.  With egraft
   installed the ``torch_dynamo_backends`` entry point already provides it;
   from a source tree without installed entry points the name is registered
   here, pointing at a wrapper that imports the compiler only when a graph
   is compiled.
2. Loads the artifacts named in ``$EGRAFT_ARTIFACTS`` (directories written
   by ``egraft compile`` / ``CompiledModel.save``, separated by ``:``;
   ``NAME=DIR`` picks the op name) with the light runtime and registers each
   as a torch custom op, ``torch.ops.egraft.<name>``, which a model's forward
   can call and Dynamo keeps as one node.  ``$EGRAFT_ARTIFACTS_DEVICE``
   (default ``cpu``) is the device they are loaded for.

3. Shows egraft's compile log in vLLM's output: the ``egraft.plugins``
   logger (one INFO line per compiled graph or piece) gets a stderr handler
   at ``$EGRAFT_LOG_LEVEL`` (default ``INFO``; ``WARNING`` quiets it), unless
   the application configured that logger already.

Calling :func:`register` again (vLLM may, per process) registers nothing
twice: an artifact directory already loaded returns its op.
"""

from __future__ import annotations

import logging
import os
import threading

ARTIFACTS_ENV = "EGRAFT_ARTIFACTS"
DEVICE_ENV = "EGRAFT_ARTIFACTS_DEVICE"
LOG_LEVEL_ENV = "EGRAFT_LOG_LEVEL"
BACKEND_NAME = "egraft"

_OPS: dict[tuple[str, str | None, str], object] = {}  # (real path, name, device) -> op
_LOCK = threading.Lock()


def register() -> dict[str, object]:
    """The plugin entry point: the backend name, then the artifacts of ``$EGRAFT_ARTIFACTS``.

    Returns the registered ops by the entry they came from (``DIR`` or ``NAME=DIR``).
    """
    register_backend_name()
    show_compile_log()
    return register_artifacts()


def show_compile_log() -> None:
    """Give the ``egraft.plugins`` logger a stderr handler at ``$EGRAFT_LOG_LEVEL`` (default INFO), once."""
    log = logging.getLogger("egraft.plugins")
    with _LOCK:
        if log.handlers or log.level != logging.NOTSET:
            return  # configured by the application, or by an earlier call
        level = os.environ.get(LOG_LEVEL_ENV, "").strip().upper() or "INFO"
        if not isinstance(logging.getLevelName(level), int):
            from ..errors import InputError

            raise InputError(f"${LOG_LEVEL_ENV}={level!r} is not a logging level; use DEBUG, INFO, WARNING or ERROR")
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("(%(processName)s pid=%(process)d) %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(level)
        log.propagate = False


def register_backend_name() -> None:
    """Make ``torch.compile(..., backend="egraft")`` resolve in this process (a no-op when it already does)."""
    from torch._dynamo import list_backends, register_backend

    with _LOCK:
        if BACKEND_NAME not in list_backends(exclude_tags=()):
            register_backend(compiler_fn=_lazy_backend, name=BACKEND_NAME)


def _lazy_backend(gm, example_inputs, **kwargs):
    # the compiler (egglog, the search, the backends) is imported only when a graph is compiled
    from .dynamo import egraft_backend

    return egraft_backend(gm, example_inputs, **kwargs)


def artifact_entries(value: str | None = None) -> list[tuple[str | None, str]]:
    """``(name or None, directory)`` for each entry of ``$EGRAFT_ARTIFACTS`` (or of `value`)."""
    text = os.environ.get(ARTIFACTS_ENV, "") if value is None else value
    out = []
    for entry in text.split(os.pathsep):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, directory = entry.partition("=")
        out.append((name.strip() or None, directory.strip()) if sep else (None, entry))
    return out


def register_artifacts(entries: list[tuple[str | None, str]] | None = None, device: str | None = None) -> dict:
    """Load each artifact and register it as ``torch.ops.egraft.<name>``; returns the ops by entry.

    A missing, corrupt or incompatible directory raises
    :class:`egraft.errors.ArtifactError` naming it: a serving process must
    not start without the ops its model calls.
    """
    from ..runtime import load

    device = device or os.environ.get(DEVICE_ENV, "").strip() or "cpu"
    ops: dict[str, object] = {}
    for name, directory in artifact_entries() if entries is None else entries:
        key = (os.path.realpath(directory), name, device)
        with _LOCK:
            if key not in _OPS:
                _OPS[key] = load(directory, device=device).register_op(name)
        ops[f"{name}={directory}" if name else directory] = _OPS[key]
    return ops
