"""Phalanx benchmarks (`phalanx bench`, `make bench`): the harness, its report and the benchmarks.

Installed as `phalanx.bench`; `registry.py` lists the benchmarks, `core.py` is what each returns.
"""
