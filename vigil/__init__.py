"""Vigil: SLO monitoring and cost observability for vLLM fleets (CLI and config)."""

__version__ = "0.1.0"
