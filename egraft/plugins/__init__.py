"""egraft inside other systems: the torch.compile backend and serving-engine glue.

* :mod:`.dynamo` — ``egraft_backend``, registered as the ``egraft``
  TorchDynamo backend (entry point ``torch_dynamo_backends``), so
  ``torch.compile(model, backend="egraft")`` works after ``pip install``.
  Its parts: :mod:`.binding` (a Dynamo graph as a module with its weights
  bound), :mod:`.exported` (export, then the one pipeline,
  ``egraft.search.pipeline``), :mod:`.partition` (the lowerable pieces of a
  graph that egraft cannot take whole), :mod:`.state` (a graph that writes
  into its inputs, a static KV cache: compiled with them as state, written
  back in place), :mod:`.buckets` (a dynamic size padded to a few sizes),
  :mod:`.serialize` (a compiled graph in torch's AOT compile cache, which
  vLLM's mode 2 saves), :mod:`.stats` (what the backend did, as counts, also
  in a file per process).
* :mod:`.vllm` — ``register()``, the ``vllm.general_plugins`` hook: the
  backend name for vLLM's compilation config and saved artifacts as torch
  custom ops.

docs/serving.md is the user's guide.

Nothing is imported here: the entry points name the modules directly, and a
serving process that only loads artifacts never pays for the compiler.
"""
