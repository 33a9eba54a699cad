"""The examples run: each script in examples/ with ``--small``, in its own process, as a user runs it.

Each test checks the exit status and the lines that carry the example's
point: the report, the checks against eager PyTorch (their errors parsed
and compared with the float32 tolerance, not just printed), the artifact
round trip.  The search cache is a fresh directory per test, so every
example compiles from scratch as it does on a new machine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TOL = 1e-4  # float32 model-level tolerance (egraft.measure.TOLERANCE)


@pytest.fixture
def run(tmp_path):
    def run(name: str, *args: str) -> str:
        # a fresh search cache, and the examples' temporary artifact directories under tmp_path
        env = {**os.environ, "EGRAFT_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": str(tmp_path)}
        env.pop("EGRAFT_DYNAMO_OPTIONS", None)
        p = subprocess.run([sys.executable, str(EXAMPLES / name), "--small", *args], capture_output=True,
                           text=True, env=env, cwd=EXAMPLES.parent, timeout=300)
        assert p.returncode == 0, f"{name} exited with {p.returncode}\n{p.stdout}\n{p.stderr}"
        assert "MISMATCH" not in p.stdout
        return p.stdout

    return run


def errors(text: str, label: str) -> list[float]:
    """Every error printed after `label`; at least one must be there."""
    found = [float(x) for x in re.findall(re.escape(label) + r"\s*([0-9.e+-]+)", text)]
    assert found, f"no {label!r} line in:\n{text}"
    return found


def test_demo(run, tmp_path):
    out = run("demo.py", "--out", str(tmp_path / "artifact"))
    assert "egraft: GPT2Block compiled for cpu" in out
    for line in ("  traced ", "  searched ", "  chosen ", "  stages ", "  checked ", "  measured ", "  vs eager "):
        assert line in out
    assert (tmp_path / "artifact" / "manifest.json").is_file()
    assert f"saved the artifact to {tmp_path / 'artifact'}" in out
    assert "compiler modules imported: none" in out
    assert "same outputs" in out and max(errors(out, "max relative error against the model:")) <= TOL
    summary = out.split("== summary", 1)[1]
    speedups = [line for line in summary.splitlines() if re.search(r"\d\.\d\dx", line)]
    assert speedups, summary
    for line in speedups:  # a speed-up is never shown without its spreads, nor concluded from noise
        assert line.count("±") == 2, line
        assert "too noisy to conclude" in line or re.search(r"x (faster|SLOWER) than", line), line
    assert f"egraft.load({str(tmp_path / 'artifact')!r})" in summary


def test_compile_api(run):
    out = run("compile_api.py")
    assert "compiled signatures: ['2x8x32:float32', '1x16x32:float32']" in out
    assert "LlamaBlock compiled for cpu (backend auto), 2 signatures" in out
    errs = errors(out, "relative error against eager PyTorch")
    assert len(errs) == 3 and max(errs) <= TOL


def test_cli_roundtrip(run):
    out = run("cli_roundtrip.py")
    for verb in ("compile", "inspect", "run"):
        assert f"\n$ egraft {verb} " in out
    assert "egraft: Classifier compiled for cpu" in out
    assert "SHA-256 checked: OK" in out
    assert "outputs match" in out and max(errors(out, "float32  max relative error")) <= TOL


def test_torch_compile_backend(run):
    out = run("torch_compile_backend.py")
    errs = errors(out, "max relative error against eager")
    assert len(errs) == 3 and max(errs) <= TOL  # the Llama block, HF GPT-2, the erfinv MLP
    assert "Hugging Face GPT-2: first call" in out  # transformers is a dev dependency: not skipped here
    assert "EgraftFallbackWarning: " in out and "aten.erfinv.default" in out
    assert out.count("EgraftFallbackWarning") == 1, "one warning, for the one model that needs it"


def test_load_and_serve(run):
    out = run("load_and_serve.py")
    assert "answers equal to the same requests served one at a time: True" in out
    assert max(errors(out, "max relative error against the model in eager PyTorch:")) <= TOL
    assert "torch.ops.egraft.served_model.default(" in out
    assert max(errors(out, "relative error against the artifact called directly")) <= TOL
