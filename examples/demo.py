"""egraft demo (placeholder: builds a tiny GPT-2 block and runs it in eager PyTorch).

To be replaced by: trace → IR summary → saturate → search → compiled run.
"""

from __future__ import annotations

import torch

from egraft.models import make


def main() -> None:
    model, args = make("gpt2_block", size="tiny", seed=0)
    with torch.no_grad():
        y = model(*args)
    print(f"gpt2_block (tiny): input {tuple(args[0].shape)} -> output {tuple(y.shape)}")


if __name__ == "__main__":
    main()
