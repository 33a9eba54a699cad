"""Signature: roles, aliases, ranged dims, JSON round trip, the lookup key, and a Graph's own signature."""

from __future__ import annotations

import json

import numpy as np
import pytest

from egraft.errors import InputError, IRError
from egraft.ir import Graph, GraphBuilder, evaluate
from egraft.ir.evaluate import check_inputs
from egraft.ir.serialize import graph_from_dict, graph_to_dict
from egraft.ir.signature import Dim, InputSpec, OutputSpec, Signature, call_key, check_shape, shape_accepts


def _state_sig() -> Signature:
    ins = (InputSpec("ids", "input", (2, Dim("seq", 1, 16)), "int64", source="input_ids"),
           InputSpec("cache", "state", (2, 16, 8), "float32"),
           InputSpec("w", "weight", (8, 8), "bfloat16"))
    outs = (OutputSpec((2, 16, 8), "float32"), OutputSpec((2, 8), "float32"))
    return Signature(ins, outs, {0: "cache"})


def _graph() -> Graph:
    b = GraphBuilder()
    x = b.input("x", (3, 4), "float32")
    m = b.input("m", (4,), "float32")
    w = b.weight("w", np.arange(20, dtype=np.float32).reshape(4, 5))
    g = b.build([(x * m) @ w, x.sum(0)])
    return g.with_interface(sources={"x": "hidden", "m": "mask"})


def test_roles_and_lookup():
    sig = _state_sig()
    assert [s.name for s in sig.call_inputs] == ["ids"]
    assert [s.name for s in sig.role("state")] == ["cache"] and [s.name for s in sig.role("weight")] == ["w"]
    assert sig["cache"].role == "state" and sig.alias_map() == {0: "cache"}
    assert sig.sources() == ["input_ids"]
    with pytest.raises(KeyError, match="no input named 'nope'"):
        sig["nope"]
    with pytest.raises(IRError, match="unknown role"):
        sig.role("buffer")


@pytest.mark.parametrize("make, match", [
    (lambda: InputSpec("x", "buffer", (3,), "float32"), "role 'buffer'"),
    (lambda: InputSpec("x", "input", (3,), "complex64"), "unknown dtype"),
    (lambda: InputSpec("x", "input", (3, -1), "float32"), "neither an int >= 0 nor a Dim"),
    (lambda: InputSpec("x", "input", (3, True), "float32"), "neither an int"),
    (lambda: InputSpec("x", "input", (2.5,), "float32"), "neither an int"),
    (lambda: Dim("s", 4, 2), "hi must be None or an int >= lo"),
    (lambda: Signature((InputSpec("x", "input", (3,), "float32"),) * 2, ()), "two inputs are named 'x'"),
    (lambda: Signature((InputSpec("x", "input", (3,), "float32"),), (((3,), "float32"),), {0: "x"}),
     "not a state input"),
    (lambda: Signature((InputSpec("c", "state", (3,), "float32"),), (((4,), "float32"),), {0: "c"}),
     "an alias keeps shape and dtype"),
    (lambda: Signature((InputSpec("c", "state", (3,), "float32"),), (((3,), "float32"),), {1: "c"}),
     "alias output 1 does not exist"),
])
def test_bad_signatures_are_refused(make, match):
    with pytest.raises(IRError, match=match):
        make()


def test_json_round_trip_keeps_everything():
    sig = _state_sig()
    doc = json.loads(json.dumps(sig.to_dict()))
    back = Signature.from_dict(doc)
    assert back == sig and hash(back) == hash(sig)
    assert back["ids"].shape[1] == Dim("seq", 1, 16) and back.aliases == ((0, "cache"),)
    assert back["ids"].source == "input_ids" and back["w"].source is None
    doc["inputs"][1]["role"] = "weight"  # the alias now names a weight
    with pytest.raises(IRError, match="not a state input"):
        Signature.from_dict(doc)
    with pytest.raises(IRError, match="damaged"):
        Signature.from_dict({"format": 1, "inputs": [{"name": "x"}], "outputs": []})
    with pytest.raises(IRError, match="format 7"):
        Signature.from_dict({**sig.to_dict(), "format": 7})


def test_key_is_what_a_call_gives():
    g = _graph()
    sig = g.signature
    x, m = np.zeros((3, 4), np.float32), np.zeros(4, np.float32)
    assert sig.key() == call_key([(x.shape, "float32"), (m.shape, "float32")])
    assert sig.key() != call_key([((3, 5), "float32"), (m.shape, "float32")])
    assert sig.key() != call_key([(x.shape, "float16"), (m.shape, "float32")])
    assert {sig.key(): 1}[call_key([((np.int64(3), np.int64(4)), "float32"), ((4,), "float32")])] == 1
    assert sig.accepts([((3, 4), "float32"), ((4,), "float32")])
    assert not sig.accepts([((3, 4), "float32")]) and not sig.accepts([((3, 4), "float32"), ((4,), "int64")])


def test_ranged_dims_accept_their_range_and_agree_by_name():
    s = Dim("seq", 2, 8)
    shape = check_shape((1, s, s))
    assert shape_accepts(shape, (1, 2, 2)) and shape_accepts(shape, (1, 8, 8))
    assert not shape_accepts(shape, (1, 9, 9)) and not shape_accepts(shape, (1, 1, 1))
    assert not shape_accepts(shape, (1, 3, 4))  # one name, one size
    assert not shape_accepts(shape, (2, 3, 3)) and not shape_accepts(shape, (1, 3))
    assert shape_accepts(check_shape((Dim("b", 0),)), (10 ** 6,))
    assert check_shape(np.array([2, 3]).tolist()) == (2, 3) and check_shape((np.int64(2),)) == (2,)


def test_graph_signature_is_its_inputs_weights_and_outputs():
    g = _graph()
    sig = g.signature
    assert [s.name for s in sig.call_inputs] == g.input_names()
    assert [(s.shape, s.dtype) for s in sig.call_inputs] == g.input_types()
    assert [s.name for s in sig.role("weight")] == g.weight_names()
    assert [(o.shape, o.dtype) for o in sig.outputs] == g.output_types()
    assert sig.sources() == ["hidden", "mask"] and sig.aliases == ()
    assert g.signature is sig  # computed once


def test_rebuilds_and_serialisation_keep_the_signature():
    g = _graph()
    assert g.pruned().signature == g.signature
    assert g.with_weights({"w": np.ones((4, 5), np.float32)}).signature == g.signature
    doc = json.loads(json.dumps(graph_to_dict(g)))
    assert graph_from_dict(doc, g.weights).signature == g.signature
    del doc["sources"], doc["aliases"]  # a record from before graphs carried them
    old = graph_from_dict(doc, g.weights)
    assert old.signature.sources() == [None, None] and old.signature.key() == g.signature.key()


def test_graph_refuses_sources_of_non_inputs_and_aliases_without_state():
    g = _graph()
    with pytest.raises(IRError, match=r"sources name \['w'\]"):
        g.with_interface(sources={"w": "weight"})
    with pytest.raises(IRError, match="non-empty names"):
        g.with_interface(sources={"x": ""})
    assert g.with_interface().signature.sources() == [None, None] and g.with_interface().nodes is g.nodes
    with pytest.raises(IRError, match="not a state input"):
        Graph(g.nodes, g.outputs, g.input_ids, g.weights, aliases={0: "x"})


def test_check_inputs_names_input_expected_and_got():
    g = _graph()
    x, m = np.ones((3, 4), np.float32), np.ones(4, np.float32)
    assert [a.shape for a in check_inputs(g, [x, m])] == [(3, 4), (4,)]
    with pytest.raises(InputError, match=r"input 'm' has shape \(5,\), the graph expects \(4,\) \(a float32"):
        check_inputs(g, [x, np.ones(5, np.float32)])
    with pytest.raises(InputError, match=r"input 'x' has dtype float64, the graph expects float32 \(shape \(3, 4\)\)"):
        check_inputs(g, [x.astype(np.float64), m])
    with pytest.raises(InputError, match=r"takes 2 input\(s\) \(x, m\), got 1"):
        check_inputs(g, [x])
    np.testing.assert_allclose(evaluate(g, [x, m])[1], x.sum(0))
