"""labkit.serve: a real small inference server (chapters 5-6).

An `Engine` runs the decoder with iteration-level batching through the simulator's
scheduling policies (`labkit.scheduling`) over a paged KV cache (`BlockManager` +
`PagedKVCache`); a FastAPI app puts it behind an OpenAI-compatible
``POST /v1/completions`` (streaming or not), ``GET /health`` and ``GET /metrics``. By
default the engine steps in a process of its own (`labkit.serve.core`, as vLLM's EngineCore),
so the HTTP side and the engine do not share one interpreter lock; ``--engine inproc`` keeps
it a thread of the server process.

    from labkit.serve import ServerConfig, start_server
    with start_server(ServerConfig(preset="tiny", policy="continuous", port=0)) as srv:
        ...  # srv.url, srv.metrics()

    from labkit.serve.engine import Engine, EngineConfig   # in-process, no HTTP
    eng = Engine(load_tiny(), EngineConfig(policy="static"))
    req = eng.submit(prompt_ids, max_tokens=32); eng.run_until_idle(); req.tokens

Command line: ``labkit serve --preset tiny --policy continuous --port 8000``
(``python -m labkit.serve`` until `labkit serve` is wired).
"""

from labkit.serve.blocks import BlockManager, OutOfBlocks
from labkit.serve.engine import Engine, EngineClosed, EngineConfig, QueueFull, Request
from labkit.serve.metrics import parse_prometheus
from labkit.serve.paged import PagedKVCache
from labkit.serve.server import ServerConfig, ServerHandle, start_server

__all__ = ["BlockManager", "Engine", "EngineClosed", "EngineConfig", "OutOfBlocks", "PagedKVCache", "QueueFull",
           "Request", "ServerConfig", "ServerHandle", "parse_prometheus", "start_server"]
