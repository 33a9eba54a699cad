"""egraft: an equality-saturation tensor compiler for model forward passes."""

__version__ = "0.1.0"

from . import errors, ir  # noqa: E402


def __getattr__(name):
    # `trace` imports torch: load it on first use so `import egraft` (and the runtime) stays light
    if name == "trace":
        from .ir.from_torch import trace

        return trace
    raise AttributeError(f"module 'egraft' has no attribute {name!r}")


__all__ = ["errors", "ir", "trace", "__version__"]
