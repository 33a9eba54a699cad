"""Which module loads an artifact: the one its manifest names (``target["loader"]``), imported on demand.

A loader module defines ``load(directory, manifest, weights, device)`` and
``files(manifest)``; ``egraft.load`` and a saved generation's loads
(``runtime.generation_read``) find it here.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import ArtifactError

# compatibility: artifacts written before the manifest named its loader (target["loader"]) hold one of
# egraft's own three backends; their loader is found by backend name (docs/artifacts.md)
LEGACY_LOADERS = {"jax": "egraft.runtime.jax_loader", "torch": "egraft.runtime.torch_loader",
                  "triton": "egraft.runtime.triton_loader"}


def loader_of(manifest: dict, directory: str = "") -> ModuleType:
    """The loader module `manifest` names (``target["loader"]``; the backend name for an older artifact), imported."""
    target = manifest["target"]
    backend = target.get("backend") if isinstance(target, dict) else None
    name = target.get("loader") if isinstance(target, dict) and "loader" in target else LEGACY_LOADERS.get(backend)
    where = repr(directory) if directory else "the artifact"
    if not isinstance(name, str) or not name:
        raise ArtifactError(f"{where} (backend {backend!r}) names no loader module in its manifest's "
                            "target['loader']: rebuild it with `egraft compile`")
    try:
        mod = importlib.import_module(name)
    except ImportError as e:
        raise ArtifactError(f"{where} is run by the loader module {name!r} (backend {backend!r}), which cannot be "
                            f"imported here ({type(e).__name__}: {e}): install the package that provides it") from None
    missing = [f for f in ("load", "files") if not callable(getattr(mod, f, None))]
    if missing:
        raise ArtifactError(f"{where} names {name!r} as its loader, but that module has no {' or '.join(missing)}() "
                            "(a loader defines load(directory, manifest, weights, device) and files(manifest)): "
                            "rebuild the artifact with `egraft compile`")
    return mod


__all__ = ["LEGACY_LOADERS", "loader_of"]
