"""``egraft compile``: search the fastest program for a device, print the report, save the artifact.

The model and its example inputs come from the MODEL argument (see
:mod:`egraft.cli.common`).  The search flags are parsed by the one config
parser, :meth:`egraft.search.config.CompileConfig.parse`, before the model
is built; ``egraft.compile`` traces the model, searches within the budget
and checks the chosen program against the model in eager PyTorch (a wrong
program is an error, never saved).  ``CompiledModel.measure`` times it
(``--compare`` says against what), the report is printed, and
``CompiledModel.save`` writes the artifact with the report in its manifest.
"""

from __future__ import annotations

import os

from ..errors import EgraftError
from .common import load_model, step
from .trace import add_model_args

EXAMPLES = """examples:
  egraft compile gated_mlp --device cpu --budget 30s -o out/gated_mlp
  egraft compile mymodels:build --input 1x128:int64 --int-high 50257 --device cuda -o out/gpt
  egraft compile path/to/model.py:build --input 2x8x64:float32 --fitness model --trials 20 -o out/m
  egraft compile mymodels:tiny_llama --generate --max-batch 4 --max-length 512 -o out/llama_gen

The factory may return (model, example_inputs); then --input is optional."""

FITNESSES = ("measured", "model")
COMPARE = {"all": True, "eager": False, "none": None}  # --compare -> CompiledModel.measure(inductor=...)


def search_config(args):
    """The command line's search flags as one :class:`~egraft.search.config.CompileConfig` (its errors: one line)."""
    from dataclasses import replace

    from ..search.config import CompileConfig

    flags = {"device": args.device, "backend": args.backend, "budget": args.budget, "seed": args.seed,
             "fitness": getattr(args, "fitness", None), "cache": not getattr(args, "no_cache", False),
             "weight_copies": getattr(args, "weight_copies", False)}
    config = CompileConfig.parse(flags, where="egraft compile")
    trials = getattr(args, "trials", None)
    if trials is not None:
        if trials < 1:
            raise EgraftError(f"--trials must be at least 1, got {trials}")
        config = config.with_(budget=replace(config.budget, trials=trials))
    return config


def compile_model(args, model, inputs, **generation):
    """egraft.compile with the command line's options (shared with ``egraft bench``)."""
    from dataclasses import fields

    from .. import compile as egraft_compile

    config = search_config(args)
    # no spinner here: the search draws its own progress bar on a terminal, and two live displays garble
    with step(f"compiled for {config.device}", spinner=False):
        return egraft_compile(model, example_inputs=inputs, **generation,
                              quantize=getattr(args, "quantize", None), group_size=getattr(args, "group_size", None),
                              **{f.name: getattr(config, f.name) for f in fields(config)})


def generation_flags(args) -> dict:
    """--generate's max_batch / max_length / chunks for egraft.compile ({} without --generate)."""
    if not getattr(args, "generate", False):
        if any(v is not None for v in (args.max_batch, args.max_length, args.chunks, args.contexts, args.rows)):
            raise EgraftError("--max-batch, --max-length, --chunks, --contexts and --rows describe generation: "
                              "add --generate")
        return {}
    if args.max_batch is None or args.max_length is None:
        raise EgraftError("--generate needs --max-batch N and --max-length N (the KV caches' rows and length)")
    sizes = {}
    for flag, value, example in (("chunks", args.chunks, "1,4,16,64"), ("contexts", args.contexts, "128,256"),
                                 ("rows", args.rows, "1,2")):
        if value is None:
            sizes[flag] = None
            continue
        try:
            sizes[flag] = tuple(int(c) for c in value.split(",") if c.strip())
        except ValueError:
            raise EgraftError(f"--{flag} {value!r}: give sizes as integers, e.g. {example}") from None
    return {"max_batch": args.max_batch, "max_length": args.max_length, **sizes}


def cmd_compile(args) -> int:
    from ..runtime.manifest import is_generation
    from ..runtime.manifest import is_artifact

    out = args.output
    # the rule CompiledModel.save applies, checked before the search rather than after it
    if os.path.exists(out) and not os.path.isdir(out):
        raise EgraftError(f"-o {out}: is a file; an artifact is saved as a directory")
    if os.path.isdir(out) and os.listdir(out) and not (is_artifact(out) or is_generation(out)):
        raise EgraftError(f"-o {out}: a non-empty directory that does not hold an egraft artifact; choose another "
                          "(an existing artifact is overwritten)")
    search_config(args)  # a bad flag fails before the model is built
    gen = generation_flags(args)
    if gen:  # a causal LM's decode step and prompt chunks, for generate(); no forward signature is compiled
        model, _ = load_model(args.model, args.input, args.seed, args.int_high, need_inputs=False)
        cm = compile_model(args, model, None, **gen)
        d = cm.generation.describe()
        print(f"generation: {d['programs']} step programs (chunk sizes {d['chunks']}, context buckets "
              f"{d['contexts']}, row buckets {d['rows']}), {d['searches']} searched, "
              f"the others reusing the decode step's choices; backends {d['backends']}; "
              f"compile seconds per program {d['compile_s']}")
        _keeping(args)
        path = cm.save(out, keep_executables=args.keep_executables)
        print(f"saved the generation to {path}; egraft.load({path!r}).generate(input_ids, max_new_tokens=...) runs it")
        return 0
    model, inputs = load_model(args.model, args.input, args.seed, args.int_high)
    cm = compile_model(args, model, inputs)
    inductor = COMPARE[args.compare]
    if inductor is not None:
        cm.measure(inductor=inductor)
    print(cm.report())
    _keeping(args)
    path = cm.save(out, keep_executables=args.keep_executables)
    print(f"saved the artifact to {path}; `egraft inspect {path}` shows it, `egraft run {path}` runs it")
    return 0


def _keeping(args) -> None:
    if args.keep_executables:
        print("saving, then compiling the saved CPU programs in a new process to keep them in the artifact",
              flush=True)


def add_search_args(p) -> None:
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or tpu (default cpu)")
    p.add_argument("--backend", default="auto", help="auto (the search chooses) or a backend: jax, torch, triton, ...")
    p.add_argument("--budget", default=None, metavar="TIME",
                   help="search time, e.g. 60s, 2m or 45 (seconds); default: the search's own (30 s)")
    p.add_argument("--trials", type=int, default=None, metavar="N",
                   help="also stop the search after N distinct candidates")
    p.add_argument("--fitness", choices=FITNESSES, default=None,
                   help="measured: time candidates on the device (default where it exists); model: the roofline "
                        "cost model, no timing (fast; the default for an absent device)")
    p.add_argument("--no-cache", action="store_true", help="search again even if a cached result exists")
    p.add_argument("--weight-copies", action="store_true",
                   help="let a backend also keep a weight in another layout (column panels: a second copy of each "
                        "weight) where the search finds it faster; default: every product reads the weight where "
                        "the model stores it")
    p.add_argument("--quantize", choices=["int8", "int4", "w8a8"], default=None,
                   help="int8: compile the model with its linear layers' weights as int8, one scale per output "
                        "channel; int4: as int4, one scale per --group-size input columns (weight-only; the "
                        "compiled program equals that quantised model); w8a8: int8 weights and each layer input "
                        "rounded to int8 per row (lossy: validated within a stated bound, its quality reported)")
    p.add_argument("--group-size", type=int, choices=[32, 64, 128], default=None,
                   help="(--quantize int4) input columns per scale (default 128; it must divide every linear "
                        "layer's input width)")


def add_parsers(verb) -> None:
    p = verb("compile", cmd_compile, help="search the fastest program for a device and save the artifact",
             epilog=EXAMPLES, description="Trace the model, search the programs equal to it for the fastest on the "
                                   "device, check the result against eager PyTorch, print the search report and "
                                   "save the artifact directory (egraft inspect / egraft run / egraft.load).")
    add_model_args(p)
    add_search_args(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="artifact directory to write (new, empty, or an artifact to overwrite)")
    p.add_argument("--keep-executables", action="store_true",
                   help="also compile the saved CPU programs (in a new process, about a first load's compile time) "
                        "and keep them in the artifact: a first egraft.load on a host like this one then reads them "
                        "instead of compiling")
    p.add_argument("--generate", action="store_true",
                   help="compile generation for a transformers causal LM (the decode step over a KV cache and one "
                        "program per prompt chunk size) instead of one forward signature; needs --max-batch and "
                        "--max-length")
    p.add_argument("--max-batch", type=int, default=None, metavar="N", help="with --generate: rows of the KV cache")
    p.add_argument("--max-length", type=int, default=None, metavar="N",
                   help="with --generate: the longest prompt + new tokens")
    p.add_argument("--chunks", default=None, metavar="LIST",
                   help="with --generate: prompt chunk sizes (default 1,4,16,64,256, capped by --max-length)")
    p.add_argument("--contexts", default=None, metavar="LIST",
                   help="with --generate: context buckets, cache slots a step reads: every one for the decode step, "
                        "the smallest of at least twice its size for a prompt chunk (default 128, 256, ... up to half of "
                        "--max-length, which the full programs read; an empty string: none)")
    p.add_argument("--rows", default=None, metavar="LIST",
                   help="with --generate: row buckets, every chunk size compiled again for that many rows "
                        "(default 1 below --max-batch; an empty string: none)")
    p.add_argument("--compare", choices=list(COMPARE), default="all",
                   help="what the result is measured against before the report: all (eager PyTorch and "
                        "torch.compile, the default), eager, or none")
