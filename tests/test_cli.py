"""The `egraft` command line: every verb, its errors, and one compile -> inspect -> run round trip.

Verbs run in-process through ``main(argv)`` (fast); one test runs ``egraft
run --check`` in a fresh process, so the artifact is shown to stand on its
own.  Compiles use the cost-model fitness and a handful of trials: the
command line is under test here, not the search.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from egraft.cli import main, parse_input_spec
from egraft.errors import EgraftError

VERBS = ("models", "trace", "compile", "inspect", "run", "bench")
FAST = ["--fitness", "model", "--trials", "3", "--no-cache"]

FACTORIES = '''
import torch

class FFT(torch.nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x).abs()

class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 4)
        self.b = torch.nn.Linear(8, 3)

    def forward(self, x):
        return {"a": torch.tanh(self.a(x)), "b": self.b(x).sum(-1)}

def fft():
    return FFT()

def two_heads():
    return TwoHeads(), (torch.randn(2, 8),)

def broken():
    raise RuntimeError("no weights here")

def tokens():
    return torch.nn.Embedding(50, 4)

def wide():
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GELU()), (torch.randn(2, 64),)
'''


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and "Warning" not in ln and "return cls.__new__" not in ln]
    assert len(lines) == 1 and lines[0].startswith("egraft: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def factories(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("user") / "user_models.py"
    path.write_text(FACTORIES)
    return path


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, factories) -> Path:
    """A compiled two-output model (dict output, weights) saved with `egraft compile`."""
    out = tmp_path_factory.mktemp("art") / "two_heads"
    assert main(["compile", f"{factories}:two_heads", *FAST, "--compare", "none", "-o", str(out)]) == 0
    return out


# --- the verbs that were there first ----------------------------------------------------------------

def test_models_lists_the_workloads(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in ("mlp", "gpt2_block", "llama_block", "resnet_block"):
        assert name in out


def test_trace_checks_against_pytorch(capsys):
    assert main(["trace", "gated_mlp", "--check", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "Graph:" in out and "ok" in out and "MISMATCH" not in out


def test_trace_factory_with_input_specs(capsys):
    assert main(["trace", "torch.nn:Tanh", "--input", "3x5:float32", "--check", "--dump"]) == 0
    out = capsys.readouterr().out
    assert "Input()" in out and "return" in out


def test_trace_a_file_factory_that_names_its_inputs(capsys, factories):
    assert main(["trace", f"{factories}:two_heads", "--check"]) == 0
    assert "2 outputs" in capsys.readouterr().out


# --- errors: one line, non-zero, no traceback ----------------------------------------------------------

def test_bad_inputs_are_clear_errors(capsys):
    assert main(["trace", "no_such_model"]) == 2
    assert "unknown workload" in one_error_line(capsys.readouterr().err)
    assert main(["trace", "torch.nn:Tanh"]) == 2
    assert "--input" in one_error_line(capsys.readouterr().err)
    with pytest.raises(EgraftError, match="SHAPE:DTYPE"):
        parse_input_spec("axb:float32")
    with pytest.raises(EgraftError, match="unknown dtype"):
        parse_input_spec("2x3:floot32")
    assert parse_input_spec("2,3") == ((2, 3), "float32")
    assert parse_input_spec("1x128:int64") == ((1, 128), "int64")


def test_integer_inputs_are_valid_indices(capsys, factories):
    from egraft.cli.common import inputs_from_specs

    (ids,) = inputs_from_specs(["500:int64"], int_high=7)
    assert ids.dtype.is_floating_point is False and 0 <= int(ids.min()) and int(ids.max()) < 7 and ids.any()
    assert main(["trace", f"{factories}:tokens", "--input", "2x6:int64", "--check"]) == 2
    assert "--int-high" in one_error_line(capsys.readouterr().err)
    assert main(["trace", f"{factories}:tokens", "--input", "2x6:int64", "--check", "--int-high", "50"]) == 0


@pytest.mark.parametrize("argv, words", [
    (["compile", "torch.nn:Tanh", "--input", "2xb:float32"], "SHAPE:DTYPE"),
    (["compile", "no_such_package.models:build", "--input", "2:float32"], "no module 'no_such_package'"),
    (["compile", "torch.nn:NoSuchLayer", "--input", "2:float32"], "has no 'NoSuchLayer'"),
    (["compile", "{factories}:broken"], "raised RuntimeError: no weights here"),
    (["compile", "{factories}:fft", "--input", "2x8:float32", *FAST], "cannot lower operator"),
    (["compile", "gated_mlp", "--budget", "soon"], "egraft compile: budget 'soon' is not a duration"),
    (["compile", "gated_mlp", "--fitness", "guess"], "invalid choice"),
    (["compile", "{factories}:two_heads", "--quantize", "int4", *FAST], "does not divide the input width 8"),
    (["compile", "gated_mlp"], "required: -o/--output"),
    (["inspect", "{tmp}/nowhere"], "does not exist"),
    (["run", "{tmp}/nowhere"], "does not exist"),
    (["bench", "{tmp}", "--rounds", "1"], "needs --check MODEL"),
])
def test_errors_are_one_line(capsys, tmp_path, factories, argv, words):
    argv = [a.format(factories=factories, tmp=tmp_path) for a in argv]
    if argv[0] == "compile" and "-o" not in argv and "required" not in words:
        argv += ["-o", str(tmp_path / "out")]
    assert main(argv) == 2
    assert words in one_error_line(capsys.readouterr().err)


def test_compile_quantises_and_the_manifest_says_how(tmp_path, factories):
    out = tmp_path / "wide"
    assert main(["compile", f"{factories}:wide", "--quantize", "int4", "--group-size", "32", *FAST,
                 "--compare", "none", "-o", str(out)]) == 0
    meta = json.loads((out / "manifest.json").read_text())
    assert meta["quantization"]["mode"] == "int4" and meta["quantization"]["group_size"] == 32, meta.get("quantization")


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(EgraftError, match="unknown workload"):
        main(["--debug", "trace", "no_such_model"])
    with pytest.raises(EgraftError, match="unknown workload"):
        main(["trace", "no_such_model", "--debug"])


@pytest.mark.parametrize("verb", VERBS)
def test_help_shows_an_example(capsys, verb):
    assert main([verb, "--help"]) == 0
    out = capsys.readouterr().out
    assert "example" in out and f"egraft {verb}" in out.split("example", 1)[1]


def test_top_level_help_lists_verbs_and_exit_codes(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(v in out for v in VERBS) and "exit codes" in out


# --- compile -> inspect -> run ------------------------------------------------------------------------

def test_inspect_shows_the_artifact(capsys, artifact):
    assert main(["inspect", str(artifact)]) == 0
    out = capsys.readouterr().out
    assert "TwoHeads" in out and "x: 2x8:float32" in out
    assert "2x4:float32, 2:float32" in out and "dict(a: tensor, b: tensor)" in out
    assert "4 tensors" in out and "SHA-256 checked: OK" in out and "signature 2x8:float32" in out
    assert main(["inspect", str(artifact), "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["format"] == "egraft-artifact" and [i["shape"] for i in m["inputs"]] == [[2, 8]]


def test_run_in_a_fresh_process_matches_the_model(artifact, factories):
    """The one subprocess round trip: the artifact and the factory, nothing of the compiling process."""
    r = subprocess.run([sys.executable, "-m", "egraft.cli", "run", str(artifact), "--check",
                        f"{factories}:two_heads"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "output 0: 2x4:float32" in r.stdout and "output 1: 2:float32" in r.stdout
    assert "outputs match" in r.stdout and "MISMATCH" not in r.stdout


def test_run_with_files_and_repeat(capsys, artifact, tmp_path):
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(artifact), "--input-file", str(tmp_path / "x.npy"), "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert "time per call" in out and "median of 3" in out
    assert main(["run", str(artifact), "--input", "3x8:float32"]) == 2
    assert "compiled for shape [2, 8] only" in one_error_line(capsys.readouterr().err)
    assert main(["run", str(artifact), "--input", "2x8", "--input", "2x8"]) == 2
    assert "takes 1 inputs" in one_error_line(capsys.readouterr().err)


def test_run_check_catches_a_different_model(capsys, artifact, factories):
    """Negative control: the factory under another seed has other weights, so --check must fail (exit 1)."""
    assert main(["run", str(artifact), "--check", f"{factories}:two_heads", "--seed", "1"]) == 1
    cap = capsys.readouterr()
    assert "MISMATCH" in cap.out and "max relative error" in cap.out
    assert "outputs differ" in cap.err


def _copy(artifact: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(artifact, dst)
    return dst


def _tamper_weights(d: Path):
    w = d / "weights.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0xFF
    w.write_bytes(bytes(data))


def _remove_a_file(d: Path):
    m = json.loads((d / "manifest.json").read_text())
    os.remove(d / next(f for f in m["files"] if f != "weights.safetensors"))


def _bump_format(d: Path):
    m = json.loads((d / "manifest.json").read_text())
    m["format_version"] = 2
    (d / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("damage, words", [(_tamper_weights, "was modified after the artifact was written"),
                                           (_remove_a_file, "is missing from the artifact"),
                                           (_bump_format, "upgrade egraft")])
@pytest.mark.parametrize("verb", ["inspect", "run"])
def test_damaged_artifacts_are_one_line_errors(capsys, artifact, tmp_path, damage, words, verb):
    d = _copy(artifact, tmp_path)
    damage(d)
    assert main([verb, str(d)]) == 2
    assert words in one_error_line(capsys.readouterr().err)


def test_compile_overwrites_an_artifact_but_no_other_directory(capsys, tmp_path, artifact, factories):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "keep.txt").write_text("mine")
    assert main(["compile", "gated_mlp", *FAST, "-o", str(tmp_path / "mine")]) == 2
    assert "does not hold an egraft artifact" in one_error_line(capsys.readouterr().err)
    d = _copy(artifact, tmp_path)
    assert main(["compile", f"{factories}:two_heads", *FAST, "--compare", "none", "-o", str(d)]) == 0
    assert main(["run", str(d), "--check", f"{factories}:two_heads"]) == 0


# --- bench ---------------------------------------------------------------------------------------------

def test_bench_prints_the_table(capsys, artifact, factories):
    """Only the table's shape is checked: timings on a shared CI machine prove nothing."""
    assert main(["bench", str(artifact), "--check", f"{factories}:two_heads", "--rounds", "2", "--calls", "1",
                 "--no-inductor"]) == 0
    out = capsys.readouterr().out
    assert "torch eager" in out and "egraft (" in out and "median" in out and "spread" in out
    assert "vs torch eager:" in out


def test_bench_compiles_a_workload_and_times_inductor(capsys):
    assert main(["bench", "mlp", *FAST, "--rounds", "2", "--calls", "1"]) == 0
    out = capsys.readouterr().out
    assert "torch.compile" in out and "vs torch.compile:" in out


def test_bench_refuses_to_time_a_wrong_program(capsys, artifact, factories):
    """Negative control: against the model under another seed, bench stops with exit 1 before timing."""
    assert main(["bench", str(artifact), "--check", f"{factories}:two_heads", "--seed", "1", "--rounds", "1",
                 "--no-inductor"]) == 1
    cap = capsys.readouterr()
    assert "not timing a wrong program" in cap.err and "median" not in cap.out


def test_weight_copies_is_a_search_flag():
    import argparse

    from egraft.cli.compile import add_search_args, search_config

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=0)  # (add_model_args' flag)
    add_search_args(p)
    assert search_config(p.parse_args([])).weight_copies is False
    assert search_config(p.parse_args(["--weight-copies"])).weight_copies is True


def test_compile_keeps_the_executable_when_asked(factories, tmp_path, capsys):
    """--keep-executables: the saved JAX CPU program's executable is in the artifact, and a load here reads it."""
    from egraft.runtime import bundled, load

    out = tmp_path / "kept"
    assert main(["compile", f"{factories}:two_heads", *FAST, "--backend", "jax", "--compare", "none",
                 "--keep-executables", "-o", str(out)]) == 0
    assert "compiling the saved CPU programs in a new process" in capsys.readouterr().out
    m = json.loads((out / "manifest.json").read_text())
    assert m["kernels"][0]["executable"]["host"] == bundled.host()
    assert load(str(out)).runner.loaded == "the executable kept in the artifact"
