"""The idiom conformance cases (MatMul, the row idioms, Attention), in library and primitive form."""

from __future__ import annotations

from egraft.ir import Group, get_op

from egraft.ir.decompose import attention_decomposed

from conformance import Case, graph_of

IDIOM_DTYPES = ("float32", "float16")


def row_attrs(op: str, axis: int) -> dict:
    """A row idiom's attributes from its op definition: the axis, and eps where it has one."""
    attrs = {"axis": axis}
    if "eps" in get_op(op).attr_names:
        attrs["eps"] = 1e-5
    return attrs


# --- MatMul -------------------------------------------------------------------------------------
def _matmul(b, dt):
    outs = []
    for k, bs in enumerate([(), (2,), (2, 3)]):
        outs.append(b.add("MatMul", (b.input(f"a{k}", bs + (5, 7), dt), b.input(f"c{k}", bs + (7, 4), dt))))
    return outs


MATMUL_SHAPES = {"batched": ((2, 5, 12), (2, 12, 7)), "ragged": ((20, 33), (33, 18))}


def _matmul_form(b, shape, form):
    a = b.input("a", MATMUL_SHAPES[shape][0], "float32")
    w = b.input("w", MATMUL_SHAPES[shape][1], "float32")
    return [b.add("MatMul", (a, w)) if form == "idiom" else a.matmul(w)]


def _linear_epilogue(b):
    x = b.input("x", (2, 6, 16), "float32")
    w = b.input("w", (24, 16), "float32")  # torch layout [out, in]: the transpose is a view
    bias = b.input("bias", (24,), "float32")
    res = b.input("res", (2, 6, 24), "float32")
    scale = b.input("scale", (2, 6, 1), "float32")
    return [((x * 0.5).matmul(w.T) + bias).gelu("tanh") * scale + res]


# --- row idioms ---------------------------------------------------------------------------------
ROW_FORMS = [((6,), 0), ((3, 8), 1), ((3, 8), 0), ((2, 3, 5), 1)]


def _row(b, op, dt):
    outs = [b.add(op, (b.input(f"x{k}", s, dt),), **row_attrs(op, ax)) for k, (s, ax) in enumerate(ROW_FORMS)]
    return outs


def _row_fused(b, op, axis):
    x = b.input("x", (2, 6, 20), "float32")
    return [b.add(op, (x * 1.5,), **row_attrs(op, axis)) * 2.0 + 1.0]  # with a prologue and an epilogue


def _rows_together(b):
    x = b.input("x", (3, 5, 24), "float32")
    return [b.add(op, (x,), **row_attrs(op, 2)) for op in sorted(Group.ROW_IDIOM)]


def _rows_primitive(b):
    x = b.input("x", (3, 5, 24), "float32")
    return [x.softmax(-1), x.layer_norm(1e-5), x.rms_norm(1e-6)]


# --- Attention ----------------------------------------------------------------------------------
ATTENTION_FORMS = [((2,), 4, 4, True, False), ((2, 3), 3, 5, False, True), ((1,), 6, 6, True, True),
                   ((), 2, 3, False, False)]  # batch, sq, sk, causal, bias


def _attention(b, dt):
    outs = []
    for n, (bs, sq, sk, causal, bias) in enumerate(ATTENTION_FORMS):
        q = b.input(f"q{n}", bs + (sq, 8), dt)
        k = b.input(f"k{n}", bs + (sk, 8), dt)
        v = b.input(f"v{n}", bs + (sk, 4), dt)
        args = (q, k, v) + ((b.input(f"bias{n}", bs + (sq, sk), dt),) if bias else ())
        outs.append(b.add("Attention", args, scale=0.35, causal=causal))
    return outs


def gqa_inputs(b, causal, bias, gqa, sq=6, sk=6, d=8):
    """q, k, v (+ bias) of 4 heads; with `gqa`, 2 kv heads repeated by views."""
    h, kvh = 4, (2 if gqa else 4)
    q = b.input("q", (2, h, sq, d), "float32")
    k = b.input("k", (2, kvh, sk, d), "float32")
    v = b.input("v", (2, kvh, sk, d), "float32")
    if gqa:  # repeat_interleave of kv heads as views
        k = k.unsqueeze(2).expand((2, kvh, h // kvh, sk, d)).reshape((2, h, sk, d))
        v = v.unsqueeze(2).expand((2, kvh, h // kvh, sk, d)).reshape((2, h, sk, d))
    ins = [q, k, v]
    if bias:
        ins.append(b.input("bias", (2, h, sq, sk), "float32"))
    return ins


GQA_FORMS = [(False, False, False), (True, False, True), (False, True, False), (True, True, True)]


def _attention_gqa(b, causal, bias, gqa):
    ins = gqa_inputs(b, causal, bias, gqa, sq=6, sk=6 if causal else 9)
    return [b.add("Attention", tuple(ins), scale=0.35, causal=causal)]


def _attention_primitive(b):
    return [attention_decomposed(*gqa_inputs(b, True, False, True), causal=True)]


def _attention_f16_wide(b):
    q = b.input("q", (1, 2, 5, 16), "float16")
    k = b.input("k", (1, 2, 7, 16), "float16")
    v = b.input("v", (1, 2, 7, 16), "float16")
    return [b.add("Attention", (q, k, v), scale=0.25, causal=False)]


def _float16_mix(b):
    x = b.input("x", (4, 16), "float16")
    w = b.input("w", (16, 24), "float16")
    y = x.matmul(w)
    return [(x * 2.0).exp2() + 1.0, x.sum(1), y, b.add("Softmax", (y,), axis=1), x.cast("float32") * 3.0]


def _flag(v: bool, name: str) -> str:
    return name if v else f"no_{name}"


def idiom_cases() -> list[Case]:
    cases = [Case(f"matmul_{dt}", graph_of(lambda b, dt=dt: _matmul(b, dt))) for dt in IDIOM_DTYPES]
    cases += [Case(f"matmul_{form}_{shape}", graph_of(lambda b, s=shape, f=form: _matmul_form(b, s, f)))
              for shape in MATMUL_SHAPES for form in ("idiom", "primitive")]
    cases.append(Case("linear_epilogue", graph_of(_linear_epilogue)))
    cases += [Case(f"row_{op}_{dt}", graph_of(lambda b, op=op, dt=dt: _row(b, op, dt)))
              for op in sorted(Group.ROW_IDIOM) for dt in IDIOM_DTYPES]
    cases += [Case(f"row_fused_{op}_axis{ax}", graph_of(lambda b, op=op, ax=ax: _row_fused(b, op, ax)))
              for op in sorted(Group.ROW_IDIOM) for ax in (2, 1)]
    cases.append(Case("rows_together", graph_of(_rows_together)))
    cases.append(Case("rows_primitive", graph_of(_rows_primitive)))
    cases += [Case(f"attention_{dt}", graph_of(lambda b, dt=dt: _attention(b, dt))) for dt in IDIOM_DTYPES]
    cases += [Case(f"attention_{_flag(c, 'causal')}_{_flag(bi, 'bias')}_{_flag(g, 'gqa')}",
                   graph_of(lambda b, c=c, bi=bi, g=g: _attention_gqa(b, c, bi, g))) for c, bi, g in GQA_FORMS]
    cases.append(Case("attention_primitive", graph_of(_attention_primitive)))
    cases.append(Case("attention_float16_wide", graph_of(_attention_f16_wide)))
    cases.append(Case("float16_mix", graph_of(_float16_mix)))
    return cases
