"""The parts of ``tests/test_prometheus_mode.py``: the systems it starts, the load it drives,
the samples it reads back, and the checker and tolerances it compares with."""
