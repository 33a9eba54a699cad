from egraft.rewrites import Limits, saturate
from egraft.rewrites.inspection import firing_table, size_table, to_dot
from egraft.rewrites.rule import program


def test_tables_and_dot():
    g = program(lambda x: (x * 1.0).T.sin(), (2, 3))
    res = saturate(g, limits=Limits(repeated_layers=False))
    ft = firing_table(res)
    assert "algebra.mul-one" in ft
    st = size_table(res)
    assert st.splitlines()[0].startswith("iter") and f"stop: {res.stop_reason}" in st
    assert len(st.splitlines()) == len(res.history) + 2
    dot = to_dot(res.snapshot(), roots=res.output_classes())
    assert dot.startswith("digraph") and dot.count("subgraph cluster_") == res.classes
    assert "Input x0" in dot and "->" in dot
