"""The data path's benchmarks: what crossing into the picker costs a request, measured against Envoy
alone and a do-nothing processor (the floor), in one run.

- ``onepass`` (``python -m kvgate.bench.datapath.onepass``): kvgate's one-pass data path, lean and
  not, and the Inference Extension's full-duplex mode, against the floor (bench/results/datapath.md);
- ``full_duplex`` (``python -m kvgate.bench.datapath``): the full-duplex picker against the floor;
- ``up``: through ``kvgate up`` itself; ``workers``: several picker processes;
- ``offline``: kvgate's own CPU per request without gRPC or Envoy; ``profile``: py-spy of a picker.

Shared pieces: ``envoy`` (listeners and clusters), ``load`` (wrk and bodies), ``procs`` (child
processes, CPU accounting), ``upstream`` and ``null_picker`` (the fast upstream and the floor),
``report``.
"""
