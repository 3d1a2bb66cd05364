"""Capacity and planning: ``capacity_search`` (judging a load level, searching the highest that
meets the SLOs), ``capacity_observed`` (the load production carried at the SLO),
``profile_store`` (saved capacity profiles), ``pool_profile`` (the profile serve sizes a pool
with), ``forecast`` (a day of traffic), ``plan`` and ``candidates`` (the cheapest configuration
that meets the SLOs), and ``replay`` (the scaling policy's decisions over history)."""
