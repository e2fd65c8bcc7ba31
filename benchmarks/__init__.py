"""``make bench``: performance figures of the retry brain, each against a baseline measured
in the same run (see :mod:`benchmarks.run`). Benchmarks are not tests;
``tests/test_benchmarks_smoke.py`` only checks that every figure can be produced."""
