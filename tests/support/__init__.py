"""What the tests share, and no tests: builders of synthetic data, fixtures, and the real
servers the tests run against (a loopback HTTP server, Prometheus, PostgreSQL, vLLM's CPU
build, gateway processes). A test module imports from here, never from another test module."""
