"""Benchmark harness of fashiontag_pipeline (issue 5, DESIGN section 5).

``make bench`` (quick) / ``make bench-full``, or ``python -m benchmarks --help``. Modules:

* :mod:`benchmarks.harness`: the reference service as a subprocess, manifests, measured runs;
* :mod:`benchmarks.scenarios`: the scenarios and the budgets;
* :mod:`benchmarks.report`: Markdown, JSON and PNG reports in ``benchmarks/results/``;
* :mod:`benchmarks.drive_api`: the engine driven through its Python API, in its own process;
* :mod:`benchmarks.loadgen`: a minimal load generator for the service scenario;
* ``benchmarks/baselines/naive.py``: the sequential stdlib script a user writes first.
"""
