"""Scaling advice: ``signals`` (a pool's scaling signals read through a ``Source``) and
``policy`` (the pure function from signals to a scale-out, scale-in or hold)."""
