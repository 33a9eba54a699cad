"""egraft: an equality-saturation tensor compiler for model forward passes."""

__version__ = "0.1.0"

from . import errors, ir  # noqa: E402

__all__ = ["errors", "ir", "__version__"]
