"""Models that write state in place, shared by the tracer's tests (the one refusal, the signature's state role)."""

import torch


class Counter(torch.nn.Module):
    """Adds its input into a buffer (``self.n.add_(x)``): a buffer mutation, as a KV cache update is."""

    def __init__(self):
        super().__init__()
        self.register_buffer("n", torch.zeros(3))

    def forward(self, x):
        self.n.add_(x)
        return x * 2
