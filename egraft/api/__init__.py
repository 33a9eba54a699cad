"""The user's entry point: ``egraft.compile(model, ...) -> CompiledModel``.

:mod:`.compiled` holds ``compile`` and :class:`CompiledModel` (the call path,
``measure``, ``report``, ``save``); :mod:`.pipeline` traces one input
signature and compiles it through ``egraft.search.pipeline`` (search, the
winner's executable, the check against eager PyTorch); :mod:`.report`
renders what was done and measured.  docs/compile.md is the user's guide.
"""

from .compiled import CompiledModel, compile  # noqa: A004 - egraft.compile is the public name
from .pipeline import CompiledProgram

__all__ = ["CompiledModel", "CompiledProgram", "compile"]
