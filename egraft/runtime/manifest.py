"""``manifest.json``: what an artifact holds, which versions wrote it, and the checks a load makes.

The manifest is written last, after every other file, with the SHA-256 of
each of them, so a directory with a manifest is a finished artifact and a
file changed afterwards is detected.  ``read_manifest`` checks, in order:
the directory exists; the manifest is present and is JSON; its ``format`` is
``egraft-artifact``; its ``format_version`` is one this egraft reads; the
fields a loader needs are there; every listed file is present with its
recorded hash; and the backend library that will run it is compatible with
the one that wrote it (``VERSION_POLICY``).  Each failure is an
``ArtifactError`` that names the file or field and what to do.

Versions.  ``format_version`` changes when the layout or the meaning of a
field changes; a reader accepts every version up to its own and refuses a
newer one.  Backend libraries are compared by major.minor: JAX artifacts are
StableHLO, which jax promises to deserialise across versions for months
(its export compatibility guarantees), so a difference is a warning; torch's
``torch.export`` archives and Triton's generated source (recompiled by the
installed triton) carry no such promise, so a difference is an error that
says which version wrote the artifact.

The program's signature.  ``inputs`` lists what a call passes, each with its
``role`` (``input``; the state of a program that updates it in place will be
listed here too) and, where the tracer knew it, the user's own name for it
(``source``); ``aliases`` lists the outputs that overwrite an input
(``{"output": k, "input": name}``); ``weights`` are the bound tensors.
:func:`manifest_signature` reads them back as an ``ir.signature.Signature``
and ``read_manifest`` checks they form one.  Manifests written before roles
and aliases were recorded read as role ``input`` and no aliases, which is
what every artifact held then.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import warnings
from importlib import metadata

from ..errors import ArtifactError, IRError
from ..ir.signature import InputSpec, OutputSpec, Signature
from .hashed import sha256_file

FORMAT = "egraft-artifact"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
LEGACY_FORMATS = {"egraft-jax-export": "an export from an older egraft (StableHLO + weights.npz)"}

# what a major.minor difference between the writing and the loading library means
VERSION_POLICY = {"jax": "warn", "jaxlib": "warn", "torch": "error", "triton": "error"}

REQUIRED = ("format", "format_version", "egraft_version", "target", "backend_versions", "inputs", "outputs",
            "output_tree", "weights", "kernels", "files")


class ArtifactVersionWarning(UserWarning):
    """The artifact was written by another version of a library whose format is meant to be portable."""


def sha256_bytes(data) -> str:
    return hashlib.sha256(data).hexdigest()


def egraft_version() -> str:
    """This egraft's version, from the package already imported (importing ``egraft`` here would be a
    dependency on the package facade, which sits above every layer)."""
    return sys.modules["egraft"].__version__


def library_version(name: str) -> str | None:
    """The installed version of a distribution, read without importing it; None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def major_minor(version: str) -> tuple[int, ...]:
    parts = []
    for p in str(version).split("+")[0].split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def listed_files(directory: str) -> list[str]:
    """Every file under `directory` except the manifest, as sorted relative POSIX paths."""
    out = []
    for root, _, files in os.walk(directory):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), directory).replace(os.sep, "/")
            if rel != MANIFEST_FILE:
                out.append(rel)
    return sorted(out)


def write_manifest(directory: str, manifest: dict, known: dict | None = None) -> dict:
    """Add format, version and the hash of every other file (`known`: relative path -> the SHA-256 of a file
    its writer hashed as it wrote it, not read again); write ``manifest.json`` atomically."""
    m = {"format": FORMAT, "format_version": FORMAT_VERSION, "egraft_version": egraft_version(), **manifest}
    known = known or {}
    m["files"] = {rel: known.get(rel) or sha256_file(os.path.join(directory, rel)) for rel in listed_files(directory)}
    missing = [k for k in REQUIRED if k not in m]
    if missing:
        raise ArtifactError(f"internal: an artifact manifest lacks {missing}")
    text = json.dumps(m, indent=1, sort_keys=False, allow_nan=False)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".manifest.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(directory, MANIFEST_FILE))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return m


GENERATION_FILE = "generation.json"  # a saved generation's index (runtime.generation_artifact reads it)


def is_generation(directory: str) -> bool:
    """Whether `directory` holds a saved generation (its step artifacts under it), not one artifact."""
    return os.path.isfile(os.path.join(os.fspath(directory), GENERATION_FILE))


def is_artifact(directory: str) -> bool:
    """Whether `directory` holds an egraft manifest (of any version): what a save may overwrite."""
    try:
        with open(os.path.join(directory, MANIFEST_FILE)) as f:
            m = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and (m.get("format") == FORMAT or m.get("format") in LEGACY_FORMATS)


def read_manifest(directory: str, *, files: bool = True, versions: bool = True) -> dict:
    """The checked manifest of the artifact in `directory` (see the module docstring).

    ``files=False`` skips the hashes (a loader that reads a file anyway checks
    it with :func:`read_verified`); ``versions=False`` skips the library check
    (to inspect an artifact meant for another machine).
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        what = "is a file" if os.path.exists(directory) else "does not exist"
        raise ArtifactError(f"{directory!r} {what}: an artifact is a directory written by CompiledModel.save "
                            "or `egraft compile -o DIR`")
    path = os.path.join(directory, MANIFEST_FILE)
    if not os.path.isfile(path):
        raise ArtifactError(f"{path} is missing: {directory!r} is not an egraft artifact "
                            "(write one with CompiledModel.save or `egraft compile -o DIR`)")
    try:
        with open(path) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path} is corrupt ({e}); rebuild the artifact with `egraft compile`") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        fmt = m.get("format") if isinstance(m, dict) else None
        hint = f" ({LEGACY_FORMATS[fmt]})" if fmt in LEGACY_FORMATS else ""
        raise ArtifactError(f"{path} is not an egraft artifact manifest: its format is {fmt!r}{hint}, "
                            f"expected {FORMAT!r}; rebuild the artifact with `egraft compile`")
    ver = m.get("format_version")
    if not isinstance(ver, int) or isinstance(ver, bool):
        raise ArtifactError(f"{path} has no valid format_version ({ver!r}); rebuild the artifact with `egraft compile`")
    if ver > FORMAT_VERSION:
        raise ArtifactError(f"{directory!r} was written by egraft {m.get('egraft_version', '?')} with format v{ver}; "
                            f"this egraft reads up to v{FORMAT_VERSION}: upgrade egraft")
    missing = [k for k in REQUIRED if k not in m]
    if missing:
        raise ArtifactError(f"{path} lacks the field(s) {', '.join(missing)}; rebuild the artifact with `egraft compile`")
    manifest_signature(m, path)
    if files:
        for rel in m["files"]:
            read_verified(directory, m, rel, keep=False)
    if versions:
        check_versions(m, directory)
    return m


def manifest_signature(manifest: dict, where: str = "the manifest") -> Signature:
    """The program's signature as the manifest records it (module docstring); ArtifactError if it is not one."""
    try:
        ins = [InputSpec(i["name"], i.get("role", "input"), tuple(i["shape"]), i["dtype"], i.get("source"))
               for i in manifest["inputs"]]
        ins += [InputSpec(w["name"], "weight", tuple(w["shape"]), w["dtype"]) for w in manifest["weights"]]
        outs = [OutputSpec(tuple(o["shape"]), o["dtype"]) for o in manifest["outputs"]]
        aliases = [(a["output"], a["input"]) for a in manifest.get("aliases", ())]
        return Signature(tuple(ins), tuple(outs), tuple(aliases))
    except (IRError, KeyError, TypeError, ValueError, AttributeError) as e:
        what = str(e) if isinstance(e, IRError) else f"{type(e).__name__}: {e}"
        raise ArtifactError(f"{where}: the inputs, weights, outputs and aliases do not form a program signature "
                            f"({what}); rebuild the artifact with `egraft compile`") from None


def read_verified(directory: str, manifest: dict, rel: str, keep: bool = True) -> bytearray | None:
    """The bytes of file `rel` after checking them against the manifest's hash (None when not `keep`)."""
    want = manifest["files"].get(rel)
    path = os.path.join(directory, *rel.split("/"))
    if rel.startswith("/") or ".." in rel.split("/"):
        raise ArtifactError(f"{directory!r}: the manifest names a file outside the artifact ({rel!r}); "
                            "rebuild the artifact with `egraft compile`")
    if want is None:
        raise ArtifactError(f"{path} is not listed in the manifest; rebuild the artifact with `egraft compile`")
    if not os.path.isfile(path):
        raise ArtifactError(f"{path} is missing from the artifact; copy the whole directory "
                            "(or rebuild it with `egraft compile`)")
    if not keep:
        got = sha256_file(path)
        data = None
    else:
        with open(path, "rb") as f:
            data = bytearray(os.fstat(f.fileno()).st_size)
            n = f.readinto(data)
        del data[n:]
        got = sha256_bytes(data)
    if got != want:
        raise ArtifactError(f"{path} was modified after the artifact was written (its SHA-256 differs from the "
                            "manifest's): rebuild it with `egraft compile`")
    return data


def single_kernel(manifest: dict, kind: str, what: str) -> dict:
    """The one kernel entry of a one-program artifact (JAX's StableHLO, torch's exported program)."""
    ks = manifest["kernels"]
    if len(ks) != 1 or ks[0].get("kind") != kind:
        raise ArtifactError(f"a {what} artifact holds one {kind} program; this manifest lists "
                            f"{[k.get('kind') for k in ks]}: rebuild it with `egraft compile`")
    return ks[0]


def check_versions(manifest: dict, directory: str = "") -> None:
    """Compare the recorded backend library versions with the installed ones (see ``VERSION_POLICY``)."""
    where = f"{directory!r}" if directory else "the artifact"
    portable = []
    for lib, wrote in manifest["backend_versions"].items():
        have = library_version(lib)
        if have is None:
            raise ArtifactError(f"{where} needs {lib} (it was written with {lib} {wrote}), which is not installed here: "
                                f"pip install '{lib}=={wrote}'")
        if major_minor(have) == major_minor(wrote):
            continue
        msg = f"{lib} {wrote}; this process has {lib} {have}"
        if VERSION_POLICY.get(lib, "error") != "warn":
            raise ArtifactError(f"{where} was written with {msg}, and {lib}'s format is not portable across versions: "
                                f"rebuild the artifact with `egraft compile` under {lib} {have}, or install "
                                f"{lib}=={wrote}")
        portable.append(msg)
    if portable:
        warnings.warn(f"{where} was written with {'; and with '.join(portable)}; its format is portable across "
                      "versions, so it is loaded anyway", ArtifactVersionWarning, stacklevel=3)


__all__ = ["ArtifactVersionWarning", "FORMAT", "FORMAT_VERSION", "MANIFEST_FILE", "VERSION_POLICY", "check_versions",
           "manifest_signature", "single_kernel",
           "is_artifact", "library_version", "listed_files", "read_manifest", "read_verified", "sha256_file",
           "write_manifest"]
