"""The runtime of `vigil serve`: the evaluation loop and its jobs (``server``), one
evaluation (``evaluation``) and the HTTP server (``http``)."""
