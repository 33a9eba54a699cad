"""ResNet basic block (conv3x3-BN-ReLU-conv3x3-BN + shortcut, ReLU), BN in eval mode.

The factory randomises BatchNorm running statistics and affine parameters
so BN is not the identity: folding BN into the conv weights is a real,
checkable rewrite.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._common import build_seeded, input_generator


class BasicBlock(nn.Module):
    """Input [batch, in_channels, size, size]; output [batch, out_channels, size/stride, size/stride].

    The shortcut is the identity when shapes match, else 1x1 conv (stride) + BN.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


def resnet_block(in_channels: int = 8, out_channels: int = 16, stride: int = 2,
                 seed: int = 0) -> BasicBlock:
    return build_seeded(lambda: BasicBlock(in_channels, out_channels, stride), seed)


def resnet_block_inputs(model: BasicBlock, batch: int, seq: int,
                        seed: int) -> tuple[torch.Tensor, ...]:
    """``seq`` is the image side: the input is [batch, in_channels, seq, seq]."""
    return (torch.randn(batch, model.in_channels, seq, seq, generator=input_generator(seed)),)
