"""egraft's cache directory, and XLA's persistent compilation cache in it.

Compiling a program with XLA takes seconds per program for a model at a
deployed size (a saved generation holds a dozen programs).  The search
(``egraft.search``) and ``egraft.load`` both point JAX's persistent
compilation cache at ``<cache root>/xla``, so a program XLA compiled once on
this machine is read back, not compiled, the next time any process asks:
a serving process that restarts loads its artifact in seconds.  A process
that set its own ``jax_compilation_cache_dir`` keeps it; ``EGRAFT_XLA_CACHE=0``
leaves JAX's settings alone.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..env import flag

ENV_VAR = "EGRAFT_CACHE_DIR"


def cache_root() -> Path:
    """``$EGRAFT_CACHE_DIR`` if set (and not empty), else the user cache directory for egraft."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("egraft"))


def xla_cache_dir() -> str:
    return str(cache_root() / "xla")


def caching() -> bool:
    """Whether egraft keeps compiled code between processes (``EGRAFT_XLA_CACHE=0``: it does not)."""
    return flag("EGRAFT_XLA_CACHE", True)


def enable_xla_cache(path: str | None = None) -> None:
    """JAX's persistent compilation cache in `path` (default: :func:`xla_cache_dir`), every program cached."""
    if not caching():
        return
    import jax

    if not jax.config.jax_compilation_cache_dir:  # a user's own setting is kept
        jax.config.update("jax_compilation_cache_dir", path or xla_cache_dir())
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


__all__ = ["ENV_VAR", "cache_root", "caching", "enable_xla_cache", "xla_cache_dir"]
