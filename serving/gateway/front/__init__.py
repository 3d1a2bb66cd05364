"""The gateway's HTTP front: the FastAPI app (``app``), answers over raw ASGI (``responses``),
uvicorn's protocol (``uvicorn_protocol``), the client's side of a request (``client``), its
body (``request_body``), API keys (``api_keys``), and server-sent events passed through
(``sse``, ``relay``)."""
