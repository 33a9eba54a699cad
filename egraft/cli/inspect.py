"""``egraft inspect``: what an artifact holds, with every file checked against its recorded SHA-256.

The manifest is read with the runtime's ``read_manifest`` (format, format
version, required fields, every file's hash), so a missing, modified or
too-new artifact is an error here exactly as it is for ``egraft.load``.
The library versions that wrote the artifact are shown next to the installed
ones; a difference that would stop a load is shown, not raised, since an
artifact may be inspected on a machine other than the one it is meant for.
The search report stored in the manifest is printed as ``egraft compile``
printed it.
"""

from __future__ import annotations

import json
import math
import warnings

from .common import shape_text

EXAMPLES = """examples:
  egraft inspect out/gated_mlp
  egraft inspect out/gated_mlp --json > manifest.json"""


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def weight_bytes(specs: list[dict]) -> int:
    from ..ir import dtypes

    return sum(math.prod(s["shape"]) * dtypes.to_numpy(s["dtype"]).itemsize for s in specs)


def tree_text(tree: dict) -> str:
    """An output structure (``egraft.runtime.outputs`` JSON) in one line: tuple(tensor, dict(logits, ...))."""
    kind = tree.get("type")
    cls = tree.get("class")
    if kind == "tensor":
        return "tensor"
    if kind == "none":
        return "None"
    if kind == "dict":
        inner = ", ".join(f"{k}: {tree_text(v)}" for k, v in zip(tree["keys"], tree["items"]))
        return f"{cls or 'dict'}({inner})"
    if kind in ("tuple", "list"):
        inner = ", ".join(tree_text(v) for v in tree["items"])
        return f"{cls or kind}({inner})"
    return str(kind)


def _kernel_line(k: dict) -> str:
    head = " ".join(str(k[f]) for f in ("name", "kind", "file") if k.get(f) is not None)
    rest = ", ".join(f"{key}={_short(v)}" for key, v in k.items() if key not in ("name", "kind", "file"))
    return head + (f"  ({rest})" if rest else "")


def _short(v) -> str:
    text = json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _versions(m: dict, directory: str) -> list[str]:
    from ..errors import ArtifactError
    from ..runtime.manifest import check_versions, library_version

    libs = ", ".join(f"{lib} {v} (installed {library_version(lib) or 'none'})"
                     for lib, v in m["backend_versions"].items())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check_versions(m, directory)
            verdict = "loadable here" + (" (with a warning: " + str(caught[0].message) + ")" if caught else "")
        except ArtifactError as e:
            verdict = f"NOT loadable here: {e}"
    return [f"libraries  {libs or 'none'}", f"           {verdict}"]


def _report_lines(report) -> list[str]:
    if not report:
        return ["report     none stored"]
    if isinstance(report, dict) and "signatures" in report:
        from ..api.report import text_report

        try:
            return ["", "search report (stored at compile time):", *text_report(report).splitlines()]
        except (KeyError, TypeError, ValueError) as e:
            return [f"report     stored, but not in a form this egraft reads ({type(e).__name__}: {e}); "
                    "`egraft inspect --json` shows it"]
    return [f"report     {_short(report)}"]


def summary(m: dict, directory: str) -> str:
    ins = ", ".join(f"{i.get('name', f'input{k}')}: {shape_text(i['shape'])}:{i['dtype']}"
                    for k, i in enumerate(m["inputs"]))
    outs = ", ".join(f"{shape_text(o['shape'])}:{o['dtype']}" for o in m["outputs"])
    target = ", ".join(f"{k} {_short(v)}" for k, v in m["target"].items())
    lines = [f"artifact   {directory}  ({m['format']} v{m['format_version']}, written by egraft {m['egraft_version']})",
             f"model      {m.get('model', '?')}" + (f"  (from {m['source']})" if m.get("source") else ""),
             f"target     {target}",
             *_versions(m, directory),
             f"inputs     {ins or 'none'}",
             f"outputs    {outs or 'none'}; structure {tree_text(m['output_tree'])}",
             f"weights    {len(m['weights'])} tensors, {_bytes(weight_bytes(m['weights']))}",
             f"kernels    {len(m['kernels'])}"]
    lines += [f"  {k}: {_kernel_line(kern)}" for k, kern in enumerate(m["kernels"])]
    lines.append(f"files      {len(m['files'])} + manifest.json, SHA-256 checked: OK")
    lines += _report_lines(m.get("report"))
    return "\n".join(lines)


DESCRIPTION = ("Show an artifact's format, egraft version, target, inputs and outputs, weights, kernels and the "
               "search report, after checking every file against the manifest's SHA-256 (a missing or modified "
               "file is an error).")


def generation_summary(doc: dict, directory: str) -> str:
    """A saved generation (``generation.json``): its spec, its one weights file (checked), and each program."""
    import os

    from ..errors import ArtifactError
    from ..runtime.manifest import read_manifest, sha256_file

    spec, w = doc.get("spec") or {}, doc.get("weights") or {}
    lines = [f"generation {directory}  ({doc.get('format')} v{doc.get('format_version')})",
             f"model      {doc.get('model', '?')}",
             f"spec       max_batch {spec.get('max_batch')}, max_length {spec.get('max_length')}, chunks "
             f"{spec.get('chunks')}, contexts {spec.get('contexts')}, rows {spec.get('rows')}, "
             f"{len(spec.get('state') or [])} caches"]
    if w:
        path = os.path.join(directory, str(w.get("file")))
        if not os.path.isfile(path):
            raise ArtifactError(f"{path} is missing from the generation; copy the whole directory (or save it again)")
        if sha256_file(path) != w.get("sha256"):
            raise ArtifactError(f"{path} was modified after the generation was saved (its SHA-256 differs from "
                                "generation.json's): save the model again")
        lines.append(f"weights    {w.get('file')}: {w.get('tensors')} tensors, {_bytes(w.get('bytes') or 0)}, "
                     "shared by every program; SHA-256 checked: OK")
    lines.append(f"programs   {len(doc.get('programs') or {})}")
    for rel in sorted(doc.get("programs") or {}):  # (a missing or modified file is an error, as in one artifact)
        m = read_manifest(os.path.join(directory, rel), files=True, versions=False)
        derived = sum(1 for s in m["weights"] if "derived" in s)
        lines.append(f"  {rel}: {m['target'].get('backend')}, {len(m['weights'])} weights "
                     f"({derived} derived from them at load), files checked: OK")
    return "\n".join(lines)


def cmd_inspect(args) -> int:
    from ..runtime.manifest import GENERATION_FILE, is_generation, read_manifest

    if is_generation(args.dir):
        import os

        from ..errors import ArtifactError

        try:
            with open(os.path.join(args.dir, GENERATION_FILE)) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise ArtifactError(f"{args.dir}/{GENERATION_FILE} is corrupt ({e}); save the model again") from None
        print(json.dumps(doc, indent=1) if args.json else generation_summary(doc, args.dir))
        return 0
    m = read_manifest(args.dir, files=True, versions=False)  # raises ArtifactError when missing or tampered
    print(json.dumps(m, indent=1) if args.json else summary(m, args.dir))
    return 0


def add_parsers(verb) -> None:
    p = verb("inspect", cmd_inspect, help="show what an artifact holds, checksums verified", epilog=EXAMPLES,
             description=DESCRIPTION, artifact_dir=True)
    p.add_argument("--json", action="store_true", help="print the (verified) manifest as JSON")
