"""`shoal gateway`: an HTTP proxy that routes requests to Services' ready pods.

``routing`` is pure (the routing table, request lookup, backend choice); ``proxy`` is the
aiohttp server that forwards requests; ``sync`` keeps the table current (server long-poll
or a static file) and reports per-pod load back; ``main`` is the command.
"""
