"""egraft: an equality-saturation tensor compiler for model forward passes."""

__version__ = "0.1.0"

from . import errors, ir  # noqa: E402


_LAZY_MODULES = ("api", "backends", "models", "rewrites", "runtime", "search", "testing")


def __getattr__(name):
    # `trace`, `compile` and the stages import torch / egglog / jax: load them on first use
    # so `import egraft` (and the runtime behind `load`) stays light
    if name == "trace":
        from .frontend import trace

        return trace
    if name == "compile":
        from .api import compile

        return compile
    if name == "from_pretrained":
        from .frontend.pretrained import from_pretrained

        return from_pretrained
    if name == "load":
        from .runtime import load

        return load
    if name in _LAZY_MODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'egraft' has no attribute {name!r}")


__all__ = ["api", "backends", "compile", "errors", "from_pretrained", "ir", "load", "models", "rewrites", "runtime",
           "search", "testing", "trace", "__version__"]
