"""Cost: ``pool`` (what a pool's GPUs cost over a window, per 1000 requests and per million
output tokens, by tier) and ``waste`` (the lower bound the traffic needed, and the rest)."""
