"""The user's entry point: ``egraft.compile(model, ...) -> CompiledModel``.

:mod:`.compiled` holds ``compile`` and :class:`CompiledModel` (the call path,
``report``, ``save``); :mod:`.pipeline` compiles one input signature (trace,
search, lower, check against eager PyTorch); :mod:`.measure` times the
compiled model against eager PyTorch and torch.compile; :mod:`.report`
renders what was done.  docs/compile.md is the user's guide.
"""

from .compiled import CompiledModel, compile  # noqa: A004 - egraft.compile is the public name
from .pipeline import Program

__all__ = ["CompiledModel", "Program", "compile"]
