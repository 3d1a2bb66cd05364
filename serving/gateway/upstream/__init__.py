"""The gateway's upstreams: the pools' replicas and their polling (``replicas``), the HTTP/1.1
client to them (``http_client``), sending a request to one (``forwarder``), and prefix-aware
routing (``routing``, over the prompt's chunk hashes of ``prompt_key``)."""
