"""describe / rebuild: a model's output structure survives JSON, in the order trace flattens it."""

from __future__ import annotations

import json
from collections import namedtuple

import numpy as np
import pytest
import torch

from egraft.errors import ArtifactError, InputError
from egraft.runtime.outputs import check, count, describe, flat_tree, rebuild


Pair = namedtuple("Pair", "a b")


def _leaves(obj):
    """torch's pytree leaves with None dropped: the order egraft.trace gives the graph outputs."""
    return [t for t in torch.utils._pytree.tree_leaves(obj) if t is not None]


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return a is b
    if a is None or b is None:
        return a is b
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))


def test_round_trip_in_pytree_order():
    t = [torch.randn(2) for _ in range(7)]
    obj = {"z": t[0], "a": (t[1], None, [t[2], {"inner": t[3]}]), 3: t[4], "none": None,
           "pair": Pair(t[5], t[6])}
    tree = json.loads(json.dumps(describe(obj)))
    assert count(tree) == 7
    check(tree)
    back = rebuild(tree, _leaves(obj))
    assert list(back) == ["z", "a", 3, "none", "pair"]  # insertion order kept, int key kept
    assert back["none"] is None and back["a"][1] is None
    assert isinstance(back["a"], tuple) and isinstance(back["a"][2], list)
    assert isinstance(back["pair"], tuple) and tree["items"][4]["class"] == "Pair"
    expected = dict(obj, pair=tuple(obj["pair"]))
    assert _same(back, expected)


def test_model_output_is_a_dict_of_its_fields():
    from transformers.modeling_outputs import CausalLMOutputWithPast

    x, y = torch.randn(3), torch.randn(3)
    out = CausalLMOutputWithPast(logits=x, hidden_states=(y,))  # loss, past_key_values, attentions: None
    tree = json.loads(json.dumps(describe(out)))
    assert tree["type"] == "dict" and tree["keys"] == ["logits", "hidden_states"]
    assert tree["class"] == "CausalLMOutputWithPast"
    back = rebuild(tree, _leaves(out))  # transformers registers ModelOutput as a pytree node
    assert type(back) is dict and back["logits"] is x and back["hidden_states"][0] is y


def test_single_tensor_and_numpy_leaves():
    a = np.ones(3)
    assert describe(a) == {"type": "tensor"}
    assert rebuild(describe(a), [a]) is a
    assert rebuild(flat_tree(2), [a, a]) == [a, a]


def test_errors():
    with pytest.raises(InputError, match=r"output\[1\] is a str"):
        describe((torch.ones(1), "text"))
    with pytest.raises(InputError, match="key"):
        describe({(1, 2): torch.ones(1)})
    with pytest.raises(ArtifactError, match="takes 2 tensor"):
        rebuild(describe((torch.ones(1), torch.ones(1))), [torch.ones(1)])
    with pytest.raises(ArtifactError, match="one key per item"):
        check({"type": "dict", "keys": ["a"], "items": []})
    with pytest.raises(ArtifactError, match="not an output tree node"):
        check({"type": "tuple", "items": [{"type": "set"}]})
