"""The PyTorch frontend: ``torch.export`` -> core ATen -> primitive IR ``Graph``.

It sits above the IR (the IR itself never imports torch): ``trace`` drives
the export, ``signature`` reads the exported program's calling convention
(roles, the user's names, state and its aliases), and ``lowering`` holds one
rule per ATen op.
"""

from .signature import program_signature, require_pure
from .tracer import export_program, lower_program, trace

__all__ = ["export_program", "lower_program", "program_signature", "require_pure", "trace"]
