"""Backtests: the generated alerts and the SLIs replayed over a history (``vigil slo backtest``)."""
