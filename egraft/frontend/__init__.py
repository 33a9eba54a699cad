"""The PyTorch frontend: ``torch.export`` -> core ATen -> primitive IR ``Graph``.

It sits above the IR (the IR itself never imports torch): ``trace`` drives
the export, and ``lowering`` holds one rule per ATen op.
"""

from .tracer import export_program, lower_program, trace

__all__ = ["export_program", "lower_program", "trace"]
