"""The runtime as a serving process uses it: a fresh process that imports nothing of the compiler,
one artifact called from many threads, and the artifact as one torch custom op under torch.compile."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from runtime_helpers import ROOT, build, random_args

from egraft.errors import ArtifactError
from egraft.runtime import load, outputs
from egraft.testing import assert_close, fresh_seed

COMPILER = ("egglog", "deap", "egraft.frontend", "egraft.rewrites", "egraft.search", "egraft.backends",
            "egraft.ir.egraph", "egraft.testing")


@pytest.fixture(scope="module", params=["jax", "torch"])
def saved(request, tmp_path_factory):
    return build("dict_heads", request.param, str(tmp_path_factory.mktemp(request.param) / "art"))


def test_fresh_process_loads_and_calls_without_the_compiler(saved):
    model, args, g, ex, d = saved
    ins = random_args(g, np.random.default_rng(fresh_seed()))
    np.savez(os.path.join(os.path.dirname(d), "ins.npz"), *ins)
    other = "torch" if ex.backend == "jax" else "jax"  # a JAX artifact needs no torch, a torch one no JAX
    # bitwise equal needs equal intra-op thread counts: the child runs with this process's (a torch artifact)
    threads = f"import torch; torch.set_num_threads({torch.get_num_threads()})\n" if ex.backend == "torch" else ""
    code = (
        "import sys, numpy as np\n" + threads +
        "import egraft.runtime\n"
        f"art = egraft.runtime.load({d!r})\n"
        f"z = np.load({os.path.join(os.path.dirname(d), 'ins.npz')!r})\n"
        "out = art(*[z[f'arr_{k}'] for k in range(len(z.files))])\n"
        "np.save(sys.argv[1], out['logits'])\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {{'egglog', 'deap', {other!r}}} "
        f"or m.startswith({COMPILER!r}))\n"
        "print('LOADED', type(out).__name__, bad)\n"
    )
    res = os.path.join(os.path.dirname(d), "out.npy")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", code, res], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env=env)
    assert "LOADED dict []" in p.stdout, p.stdout + p.stderr
    assert_close([np.load(res)], [ex(*ins)[0]], tol=0.0, what="fresh process vs executable")


def test_threads_share_one_artifact(saved):
    """Load once, 8 threads x 20 calls with their own random inputs: every result right."""
    model, args, g, ex, d = saved
    art = load(d)
    seed = fresh_seed()
    results: dict = {}
    errors: list = []

    main_threads = torch.get_num_threads()

    def worker(t):
        rng = np.random.default_rng([seed, t])
        torch.set_num_threads(main_threads)  # OpenMP's count is per thread: bitwise equal needs the main thread's
        try:
            for k in range(20):
                ins = random_args(g, rng)
                if k % 2:  # torch and numpy calls interleaved
                    out = art(*[torch.from_numpy(a) for a in ins])
                    got = [t_.numpy() for t_ in (out["logits"], out["extra"][0], out["best"][0])]
                else:
                    out = art(*ins)
                    got = [out["logits"], out["extra"][0], out["best"][0]]
                results[(t, k)] = (ins, got)
        except Exception as e:  # reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors
    assert len(results) == 160
    for (t, k), (ins, got) in results.items():
        assert_close(got, ex(*ins), [dt for _, dt in g.output_types()], tol=0.0,
                     what=f"thread {t} call {k} (seed={seed})")


def test_register_op_under_torch_compile(saved):
    model, args, g, ex, d = saved
    art = load(d)
    op = art.register_op()
    assert art.register_op() is op  # same artifact, same name: the op is rebound, not redefined
    name = str(op).split("::")[1].rstrip(")>")  # <CustomOpDef(egraft::<name>)>
    assert name.startswith("dict_heads_") and hasattr(torch.ops.egraft, name)

    def fn(x, bias):
        logits, hsum, best = op(x, bias)
        return outputs.rebuild(art.output_tree, [logits * 2.0, hsum, best])

    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    got = compiled(*args)
    with torch.no_grad():
        ref = model(*args)
    assert isinstance(got, dict) and got["extra"][1] is None
    assert torch.allclose(got["logits"], 2.0 * ref["logits"], rtol=1e-5, atol=1e-5)
    assert torch.equal(got["best"][0], ref["best"][0])
    # Dynamo saw one node for the whole artifact (plus the unpacking and the multiplication)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=record, fullgraph=True)(*args)
    assert len(graphs) == 1
    calls = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    ours = [t for t in calls if isinstance(t, torch._ops.OpOverload) and t.namespace == "egraft"]
    assert len(ours) == 1 and ours[0].name() == f"egraft::{name}", calls
    assert len([t for t in calls if "getitem" not in str(t)]) == 2, calls
    # the fake implementation gives the manifest's shapes without running the program
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fakes = op(*[mode.from_tensor(a) for a in args])
    assert [tuple(f.shape) for f in fakes] == [s.shape for s in art.output_specs]


def test_register_op_names(saved, tmp_path):
    model, args, g, ex, d = saved
    art = load(d)
    op = art.register_op(f"renamed_{ex.backend}")
    out = op(*args)
    assert len(out) == len(art.output_specs)
    with pytest.raises(ArtifactError, match="not an identifier"):
        art.register_op("bad name")
    other = load(build("mlp", ex.backend, str(tmp_path / "mlp"))[-1])
    with pytest.raises(ArtifactError, match=f"renamed_{ex.backend} is already defined .* pass another name"):
        other.register_op(f"renamed_{ex.backend}")


def test_importing_the_runtime_imports_no_backend_library():
    """The backend's libraries come with a load (jax for a JAX artifact, torch for a torch one), not before."""
    code = ("import sys, egraft.runtime\n"
            "print('MODS', sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'jax', 'jaxlib', 'triton', 'egglog', 'deap', 'safetensors') or m.startswith(('egraft.backends', "
            "'egraft.frontend', 'egraft.search', 'egraft.rewrites', 'egraft.api'))))\n")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert "MODS []" in p.stdout, p.stdout + p.stderr


def test_the_fast_torch_path_equals_the_checked_one_and_steps_aside(tmp_path):
    """A plain CPU torch call takes the runner's fast path; grad, a wrong shape or numpy inputs take the checked one."""
    import numpy as np
    import pytest
    import torch

    import egraft
    from egraft.backends import lower
    from egraft.backends.artifact import save_artifact
    from egraft.errors import InputError
    from egraft.models import MODELS

    spec = MODELS["mlp"]
    model = spec.build("tiny", seed=3)
    (x,) = spec.example_inputs(model, seed=4)
    from egraft.runtime.outputs import describe

    ex = lower(egraft.trace(model, (x,)), "jax", "cpu")
    with torch.no_grad():
        want = model(x)
    art = egraft.load(save_artifact(ex, str(tmp_path / "a"), meta={"input_names": ["x"], "output_tree": describe(want)}))
    calls = []
    fast = art.runner.fast
    art._fast = lambda xs: calls.append(1) or fast(xs)
    got = art(x)
    assert calls and torch.equal(got, art.run_flat(x)[0]) and torch.equal(got, ex(x)[0])
    assert got.is_contiguous() and got.numpy().flags.writeable  # the caller's own memory
    assert torch.allclose(art(x.clone().requires_grad_(True)), want, rtol=1e-5, atol=1e-6)  # checked path
    np.testing.assert_array_equal(art(x.numpy()), got.numpy())  # numpy in, numpy out
    with pytest.raises(InputError, match="expected shape"):
        art(torch.cat([x, x]))
