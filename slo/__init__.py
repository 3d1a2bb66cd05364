"""SLO math: PromQL-exact primitives, SLIs, burn rates, budgets, cost, scaling."""
