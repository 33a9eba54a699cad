"""The `egraft` command line: the verbs that exist today, and its errors."""

import pytest

from egraft.cli import main, parse_input_spec
from egraft.errors import EgraftError


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


def test_bad_inputs_are_clear_errors(capsys):
    assert main(["trace", "no_such_model"]) == 2
    assert "unknown workload" in capsys.readouterr().err
    assert main(["trace", "torch.nn:Tanh"]) == 2
    assert "--input" in capsys.readouterr().err
    with pytest.raises(EgraftError, match="SHAPE:DTYPE"):
        parse_input_spec("axb:float32")
    assert parse_input_spec("2,3") == ((2, 3), "float32")
