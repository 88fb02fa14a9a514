"""Run the server: `ServerConfig`, `run()` (this process, blocking) and `start_server()`
(a child process, for tests, notebooks and the load generator).

    from labkit.serve import ServerConfig, start_server
    with start_server(ServerConfig(preset="tiny", policy="continuous", port=0)) as srv:
        srv.url        # "http://127.0.0.1:<port>"
        srv.metrics()  # GET /metrics parsed into {sample name: value}

Shutdown (SIGTERM / SIGINT, or leaving the `with` block): the server stops accepting,
new requests on open connections get 503, requests in flight may finish for `drain_s`
seconds and are then ended with an error; the process exits 0 within seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import torch

from labkit.paths import REPO
from labkit.serve.core import ENGINE_MODES
from labkit.serve.engine import Engine, EngineConfig, EngineSettings, setting
from labkit.serve.loading import check_model, die_with_parent, load_model
from labkit.serve.metrics import parse_prometheus
from labkit.serve.preprocess import IMPLEMENTATIONS, StageConfig
from labkit.serve.surface import DEFAULT_MAX_BODY_BYTES

log = logging.getLogger("labkit.serve")
CACHES = ("exact", "semantic")


@dataclasses.dataclass
class ServerConfig(EngineSettings):
    """Everything `labkit serve` takes: the engine's settings (`EngineSettings`) and the
    server's own, each with its help text."""

    preset: str = setting("tiny", "model preset: tiny (the trained checkpoint) or a random-weight shape "
                          "(small, 1b, 7b)")
    port: int = setting(8000, "TCP port (0 = any free port)")
    host: str = setting("127.0.0.1", "address to bind (default 127.0.0.1, loopback only)")
    threads: int = setting(1, "torch intra-op threads in the server process (0 = torch's default; 1 leaves "
                           "the other cores to a load generator)")
    cache: str | None = setting(None, f"result cache: {' | '.join(CACHES)} (default none; labkit.serve.cache)",
                                type=str, choices=CACHES)
    drain_s: float = setting(5.0, "seconds shutdown lets requests in flight finish")
    device: str = setting("auto", "auto | cpu | cuda | mps")
    log_level: str = setting("warning", "debug | info | warning | error")
    api_key: str | None = setting(None, "require 'Authorization: Bearer KEY' (401 otherwise) on all but "
                                  "/health, /metrics, /version", type=str)
    served_model_name: str | None = setting(None, "model id clients send and /v1/models lists (default: the "
                                            "preset's name)", type=str)
    max_body_bytes: int = setting(DEFAULT_MAX_BODY_BYTES, "request bodies larger than this get 413, unread (bytes)")
    preprocess: str = setting("off", "pre-processing stage for text prompts of /v1/completions (retrieve, "
                              "fetch, rerank, template; labkit.serve.preprocess): off | global_lock (one shared "
                              "document-store client behind a process-wide lock) | per_thread (a client per "
                              "worker thread)",
                              choices=IMPLEMENTATIONS)
    rerank_k: int = setting(4, "pre-processing: BM25 candidates the reranker scores with the model")
    stage_workers: int = setting(0, "pre-processing: worker threads that run the stage (0 = 32, sized for I/O)")
    store_delay_ms: float = setting(0.0, "pre-processing: the document store's answer time (ms), the network round "
                                    "trip and the store's work (labkit.serve.docstore)")
    quantize: str | None = setting(None, "serve the model with quantized weights: a labkit.quant scheme, e.g. int8 "
                                   "(default: as trained)", type=str)
    engine: str = setting("proc", "where the engine steps: proc (its own process, as vLLM's EngineCore: the HTTP "
                          "side and the engine each get an interpreter lock) | inproc (a thread of the server "
                          "process, sharing its lock)", choices=ENGINE_MODES)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cache is not None and self.cache not in CACHES:
            raise ValueError(f"cache {self.cache!r} unknown; choose None or one of {', '.join(CACHES)}")
        if self.engine not in ENGINE_MODES:
            raise ValueError(f"engine {self.engine!r} unknown; choose one of {', '.join(ENGINE_MODES)}")
        self.stage_config()  # raises naming the bad value and the choices
        if self.quantize is not None:
            from labkit.quant.core import parse_scheme

            parse_scheme(self.quantize)  # raises naming the bad scheme
        if not (isinstance(self.port, int) and 0 <= self.port <= 65535):
            raise ValueError(f"port must be an integer in 0..65535 (0 = any free port), got {self.port!r}")
        if not (isinstance(self.threads, int) and self.threads >= 0):
            raise ValueError(f"threads must be an integer >= 0 (0 = torch's default), got {self.threads!r}")
        if not self.drain_s >= 0:
            raise ValueError(f"drain_s must be >= 0 s, got {self.drain_s!r}")
        if not (isinstance(self.max_body_bytes, int) and self.max_body_bytes >= 1024):
            raise ValueError(f"max_body_bytes must be an integer >= 1024 bytes, got {self.max_body_bytes!r}")
        for name in ("api_key", "served_model_name"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, str) and v.strip() and v.isprintable()):
                raise ValueError(f"{name} must be a non-empty printable string or None, got {v!r}")

    def stage_config(self) -> StageConfig:
        """The pre-processing stage's settings from this config."""
        return StageConfig(self.preprocess, rerank_k=self.rerank_k, workers=self.stage_workers,
                           store_delay_s=self.store_delay_ms / 1e3)

    def engine_config(self, eos_id: int | None) -> EngineConfig:
        """The engine's settings from this config, with the tokenizer's `eos_id`."""
        settings = {f.name: getattr(self, f.name) for f in dataclasses.fields(EngineSettings)}
        return EngineConfig(**settings, eos_id=eos_id)

    def to_args(self) -> list[str]:
        """The `labkit serve` command-line arguments for this config."""
        out = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out += [f"--{f.name.replace('_', '-')}", str(v)]
        return out



def build(cfg: ServerConfig):
    """Model, tokenizer, engine, service and FastAPI app for `cfg` (the engine not started; with
    `engine="proc"` its process is started and warm, `labkit.serve.core`)."""
    from labkit.tokenizer import load_tokenizer

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    tok = load_tokenizer()
    if cfg.engine == "proc":
        from labkit.serve.core import CoreSpec, EngineProc

        # The core starts in the background (a fresh interpreter, seconds): meanwhile this process
        # loads what it needs itself, and `engine.ready()` below waits for the core.
        engine = EngineProc(CoreSpec(cfg.preset, cfg.device, cfg.threads, cfg.engine_config(tok.eos_id),
                                     cfg.log_level, cfg.quantize), wait=False)
        # The stage's reranker runs the model here, in the server process: its own copy, loaded only then.
        model = engine.model if cfg.preprocess != "off" else None
    else:
        model = load_model(cfg.preset, cfg.device, cfg.quantize)
        check_model(model, cfg.preset, cfg.max_model_len)
        engine = Engine(model, cfg.engine_config(tok.eos_id))
    stage = None
    try:
        from labkit.serve.app import Service, create_app  # FastAPI's import, while the core starts

        if cfg.preprocess != "off":
            from labkit.serve.preprocess import Stage

            stage = Stage(model, tok, cfg.stage_config())  # starts the document store; closed at shutdown
            stage.run("warm up the stage")  # builds the document index now, not on the first request
        if cfg.engine == "proc":
            engine.ready()
    except BaseException:
        if stage is not None:
            stage.close()
        if cfg.engine == "proc":
            engine.proc.kill()  # not ready yet, or failed: nothing to drain
        raise
    if tok.vocab_size > engine.vocab:
        engine.shutdown(0.0)
        raise ValueError(f"tokenizer vocab {tok.vocab_size} > model vocab {engine.vocab}")
    cache = None
    if cfg.cache:
        from labkit.serve.cache import make_cache

        cache = make_cache(cfg.cache)
    service = Service(engine, tok, cfg.served_model_name or cfg.preset, cache, stage)
    service.api_key, service.max_body_bytes = cfg.api_key, cfg.max_body_bytes  # read by surface.install
    return service, create_app(service)


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for uvicorn (`port` 0 picks a free one).

    It is created with proto=IPPROTO_TCP on purpose: asyncio sets TCP_NODELAY on accepted
    connections only when the listening socket says it is TCP (``sock.proto``), and a
    ``socket.socket(AF_INET)`` says proto 0. Without NODELAY, Nagle holds the first small
    SSE chunk on a reused keep-alive connection until the client's delayed ACK (~40 ms
    on Linux), which inflates TTFT as every client sees it. Set on the listener as well:
    Linux copies it to accepted sockets."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM,
                         socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


def run(cfg: ServerConfig, port_file: str | None = None) -> int:
    """Serve until SIGTERM/SIGINT (blocking); returns the exit status."""
    import uvicorn

    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    service, app = build(cfg)
    engine = service.engine
    sock = listen_socket(cfg.host, cfg.port)
    port = sock.getsockname()[1]
    if cfg.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"labkit serve: WARNING listening on {cfg.host}, reachable from other machines", flush=True)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # Stop taking requests and start the drain clock at the first signal; a second
            # SIGINT forces the exit. The signal is not re-raised afterwards: exit 0.
            engine.begin_shutdown(cfg.drain_s)
            self.force_exit = self.should_exit and sig == signal.SIGINT
            self.should_exit = True

    server = Server(uvicorn.Config(app, log_level=cfg.log_level, access_log=False, lifespan="off",
                                   timeout_graceful_shutdown=int(cfg.drain_s + 2), timeout_keep_alive=5))
    engine.warmup()
    engine.start(threads=cfg.threads or None)
    where = f"engine=proc (pid {engine.pid})" if cfg.engine == "proc" else "engine=inproc"
    print(f"labkit serve: http://{cfg.host}:{port} preset={cfg.preset} policy={cfg.policy} "
          f"max_batch={cfg.max_batch} kv={engine.kv.total}x{cfg.block_size}-token blocks ({cfg.kv_dtype}, "
          f"{cfg.kv_reserve}) threads={getattr(engine, 'threads', torch.get_num_threads())} {where}", flush=True)
    if port_file:
        Path(port_file).write_text(str(port))
    try:
        server.run(sockets=[sock])
    finally:
        engine.begin_shutdown(0.0)
        engine.join(10.0)
        if service.stage is not None:
            service.stage.close()  # the document store process goes with the server
    return 0


class ServerHandle:
    """A server in a child process; `stop()` (or leaving `with`) shuts it down gracefully."""

    def __init__(self, proc: subprocess.Popen, port: int, host: str, log_path: Path):
        self.proc, self.port, self.host, self.log_path = proc, port, host, log_path
        self.url = f"http://{host}:{port}"

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metrics(self) -> dict[str, float]:
        """GET /metrics parsed into {sample: value}, e.g. {'vllm:num_requests_running{model_name="tiny"}': 3.0};
        read one with `labkit.serve.metrics.sample(m, "vllm:num_requests_running")`."""
        status, text = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"GET /metrics answered {status}: {text[:200]}")
        return parse_prometheus(text)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait up to `timeout` s for the graceful exit (then kill); returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()



def start_server(cfg: ServerConfig, timeout_s: float = 60.0) -> ServerHandle:
    """Start `python -m labkit.serve` with `cfg` in a child process; return once GET /health
    answers 200. Output goes to a log file (`handle.log()`); a failed start raises with it."""
    tmp = Path(tempfile.mkdtemp(prefix="labkit-serve-"))
    port_file, log_path = tmp / "port", tmp / "server.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "labkit.serve", *cfg.to_args(), "--port-file", str(port_file)],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                preexec_fn=die_with_parent if sys.platform == "linux" else None)
    deadline = time.monotonic() + timeout_s
    handle = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"labkit serve exited with {proc.returncode} during start-up:\n"
                               f"{log_path.read_text(errors='replace')[-3000:]}")
        if handle is None and port_file.exists() and port_file.read_text().strip():
            handle = ServerHandle(proc, int(port_file.read_text()), cfg.host, log_path)
        if handle is not None:
            try:
                if handle.get("/health", timeout=2.0)[0] == 200:
                    return handle
            except OSError:
                pass
        time.sleep(0.05)
    proc.kill()
    proc.wait(5)
    raise TimeoutError(f"labkit serve did not answer /health within {timeout_s} s:\n"
                       f"{log_path.read_text(errors='replace')[-3000:]}")
