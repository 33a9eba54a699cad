"""egraft as a torch.compile backend: ``torch.compile(model, backend="egraft", options={...})``.

    python examples/torch_compile_backend.py           # 10 s of search per captured graph
    python examples/torch_compile_backend.py --small   # the cost model and a few candidates (seconds)

Three models, each checked against eager PyTorch:

1. a Llama block from ``egraft.models``;
2. a small Hugging Face GPT-2 (random weights, no download; skipped with a
   message when ``transformers`` is not installed);
3. a model using an op egraft cannot lower (``torch.erfinv``): that op runs
   in PyTorch, the rest is compiled by egraft, and one
   ``EgraftFallbackWarning`` says which op and which line of the model.

The first call of each input shape searches and compiles (the budget is
per captured graph); later calls run the compiled program.  Installing
egraft registers the backend name, so ``import egraft`` is not needed for
``backend="egraft"``; it is imported here for the models and the warning.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from torch import nn

from egraft.models import MODELS, hf
from egraft.plugins.dynamo import EgraftFallbackWarning
from egraft.measure import TOLERANCE, rel_err

# --small: rank two candidates with the roofline cost model (no timing) after two rewrite iterations
SMALL = {"fitness": "model", "budget": {"seconds": None, "trials": 2, "population": 2}, "limits": {"iterations": 2}}


class ErfinvMLP(nn.Module):
    """Linear, tanh, erfinv (egraft has no rule for it), Linear: egraft compiles the parts around erfinv."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return torch.relu(self.b(torch.erfinv(torch.tanh(self.a(x)) * 0.9) * 0.5)) + 1.0


def check(name: str, model: nn.Module, args: tuple, kwargs: dict, options: dict) -> bool:
    """Compile `model` with the egraft backend, call it twice, compare with eager; print what happened."""
    compiled = torch.compile(model, backend="egraft", options=options)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", EgraftFallbackWarning)
        t = time.perf_counter()
        got = hf.flat_outputs(compiled(*args, **kwargs))  # first call: Dynamo captures, egraft compiles
        first = time.perf_counter() - t
        t = time.perf_counter()
        compiled(*args, **kwargs)  # later calls run the compiled program
        again = time.perf_counter() - t
        want = hf.flat_outputs(model(*args, **kwargs))
    err = max(rel_err(g.numpy(), w.numpy()) for g, w in zip(got, want))
    ok = len(got) == len(want) and err <= TOLERANCE["float32"]
    print(f"{name}: first call {first:.1f} s (compiles), next call {again * 1e3:.1f} ms; {len(got)} output(s), "
          f"max relative error against eager {err:.1e} (allowed {TOLERANCE['float32']:.0e})"
          + ("" if ok else "  MISMATCH"))
    for w in caught:
        if issubclass(w.category, EgraftFallbackWarning):
            print(f"  {w.category.__name__}: {w.message}")
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="10s", help="search time per captured graph (e.g. 10s, 1m)")
    ap.add_argument("--small", action="store_true", help="rank two candidates by the cost model; no timing")
    args = ap.parse_args(argv)
    options = SMALL if args.small else {"budget": args.budget}

    spec = MODELS["llama_block"]
    block = spec.build("tiny", seed=0)
    ok = check("llama_block", block, spec.example_inputs(block, batch=2, seq=8, seed=1), {}, options)

    try:
        import transformers  # noqa: F401 - a dev dependency: only this part needs it
    except ImportError:
        print("Hugging Face GPT-2: skipped, transformers is not installed (pip install transformers)")
    else:
        gpt2, kwargs = hf.build("gpt2", layers=1 if args.small else 2, seed=0)  # kwargs: use_cache=False
        ids = torch.randint(0, gpt2.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
        ok &= check("Hugging Face GPT-2", gpt2, (ids,), kwargs, options)

    ok &= check("erfinv MLP (fallback)", ErfinvMLP(), (torch.randn(4, 16),), {}, options)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
