"""sglang-standin: a stand-in for ``sglang.launch_server`` for GPU-less lab hosts.

This package is NOT SGLang. It loads no model weights and uses no GPU. It
parses the same command line as ``python -m sglang.launch_server`` (with
sglang's own parser when sglang is importable), checks the model directory,
and serves the HTTP endpoints a deployment uses to gate on readiness
(``/health``, ``/v1/models``, ``/server_info``, ``/v1/chat/completions``),
with the same "connection refused while loading, 503 while warming up"
behaviour as the real server.

Run it as ``python -m sglang_standin.launch_server <sglang flags>``.
"""

__version__ = "0.1.6"
DIST_NAME = "sglang-standin"
STANDIN = True
