"""Vigil's ground: config, data model, errors, conventions, clock and durations.

Every other package stands on it, and it imports none of them; the ``vigil`` command lives in
``vigil_shell``.
"""

__version__ = "0.1.0"
