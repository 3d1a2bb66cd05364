"""The ``vigil`` command and the processes it wires: ``serve``, ``demo``, ``alerts``.

This is the top of the import graph: it may import every package (``collector``, ``slo``,
``alerts``, ``dashboard``, ``serving``, the ground ``vigil``), and none of them imports it.
"""
