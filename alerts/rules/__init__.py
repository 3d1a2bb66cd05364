"""The rule generator (``vigil rules``): files for a team's own Prometheus stack, from the specs.

spec → recording rules (``recording``, expressions from ``promql``) → alerting rules
(``alerting``) → ``promtool`` tests (``promtool_tests``, expectations from ``engine_value``)
→ scrape configuration (``scrape_config``), KEDA (``keda``) and Prometheus Operator
(``operator``) objects. ``pipeline`` runs the steps into one ``RulesResult``, ``model`` holds
the values passed along, ``yaml_emitter`` writes them byte-stable; the command is
``vigil_shell.rules_cli``.

Pure functions of the configuration: nothing here reads a clock, a store or the network, and
nothing imports the alerting runtime of ``alerts`` (``tests/test_layers.py``).
"""
