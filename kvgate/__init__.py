"""kvgate: an inference gateway for LLM serving fleets (Envoy data plane, KV-cache, prefix and LoRA
aware endpoint picker, Gateway API control plane).

One import namespace for the whole distribution: ``kvgate.policies`` (domain types and the
scheduler), ``kvgate.extproc`` (the ext_proc service), ``kvgate.gateway`` (control plane, picker
runtime, the ``kvgate`` command), ``kvgate.simulator``, ``kvgate.bench`` and ``kvgate.proto``. In the
source tree they are the folders at the repository's root (``policies/``, ``extproc/``, ...), which
this folder links to; an installed wheel holds them under ``kvgate/``.
"""
