"""labkit serve as real clients see it: TCP_NODELAY on accepted sockets, the openai client on
completions and chat (streaming and not, stop strings, logprobs, echo), the extra endpoints,
and every bad input with its exact status and message (401, 404, 405, 413, 415, 400)."""

import asyncio
import json
import math
import socket
import threading
import time

import httpx
import pytest

from labkit.serve import ServerConfig, start_server
from labkit.serve import protocol
from labkit.serve.metrics import sample
from labkit.serve.server import listen_socket
from labkit.tokenizer import load_tokenizer

TOK = load_tokenizer()
KEY = "sk-labkit-test"
NAME = "labkit-tiny"
LIMIT = 64 * 1024  # the test server's body limit (bytes)
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "Once upon a time"


# ====================================================================== transport

def _accepted_nodelay(sock: socket.socket) -> int:
    """Serve `sock` with asyncio (as uvicorn does) and return TCP_NODELAY of the accepted socket."""
    seen: list[int] = []

    async def main() -> None:
        got = asyncio.Event()

        class Proto(asyncio.Protocol):
            def connection_made(self, transport):
                s = transport.get_extra_info("socket")
                seen.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                got.set()

        server = await asyncio.get_running_loop().create_server(Proto, sock=sock)
        client = socket.create_connection(sock.getsockname()[:2])
        await asyncio.wait_for(got.wait(), 10)
        client.close()
        server.close()

    asyncio.run(main())
    return seen[0]


def test_accepted_connections_have_tcp_nodelay():
    assert _accepted_nodelay(listen_socket("127.0.0.1", 0)) != 0


def test_a_proto_0_listener_would_leave_nagle_on():
    """The bug this guards against: asyncio sets NODELAY only for sockets whose proto is TCP."""
    sock = socket.socket(socket.AF_INET)
    sock.bind(("127.0.0.1", 0))
    assert sock.proto == 0 and _accepted_nodelay(sock) == 0


# ====================================================================== wire format (no server)

@pytest.mark.parametrize("payload, field, words", [
    ({"prompt": "x", "seed": 2 ** 70}, "seed", "[-2**63, 2**64)"),
    ({"prompt": "x", "top_k": -2}, "top_k", ">= -1"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"prompt": "x", "stop": [""]}, "stop", "non-empty"),
    ({"prompt": "x", "logprobs": 21}, "logprobs", "[0, 20]"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens", "only with 'echo'"),
    ({"prompt": "x", "echo": "yes"}, "echo", "true or false"),
    ({"prompt": "x", "stream": True, "stream_options": {"include_usage": True, "x": 1}}, "stream_options",
     "continuous_usage_stats"),
])
def test_completion_fields_name_the_bad_value(payload, field, words):
    with pytest.raises(protocol.BadRequest) as e:
        protocol.parse_completion(payload)
    assert e.value.param == field and words in str(e.value), str(e.value)


@pytest.mark.parametrize("payload, field", [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": 3}, "logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "echo": True}, "echo"),
])
def test_chat_fields_name_the_bad_value(payload, field):
    with pytest.raises(protocol.BadRequest) as e:
        protocol.parse_chat(payload)
    assert e.value.param == field, str(e.value)


def test_vllm_and_guidellm_spellings_are_accepted():
    r = protocol.parse_completion({"prompt": "x", "top_k": -1, "stream": True, "max_tokens": 4, "ignore_eos": True,
                                   "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert (r.top_k, r.include_usage, r.continuous_usage) == (0, True, True)
    c = protocol.parse_chat({"messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                             "max_completion_tokens": 7, "logprobs": True, "top_logprobs": 2})
    assert c.prompt == "System: Be brief.\n\nUser: Hi\n\nAssistant:" and c.max_tokens == 7 and c.logprobs == 2
    assert protocol.parse_completion({"prompt": [[1, 2, 3]], "echo": True, "max_tokens": 0}).prompt == [1, 2, 3]


def test_lone_surrogate_and_unknown_model_are_refused():
    with pytest.raises(protocol.BadRequest) as e:
        protocol.parse_json(b'{"prompt": "a\\ud800b"}')
    assert e.value.param == "prompt" and e.value.status == 400 and "surrogate" in str(e.value)
    assert protocol.parse_json(b'{"prompt": "\\ud83d\\ude42"}') == {"prompt": "\U0001f642"}  # a valid pair
    with pytest.raises(protocol.NotFound) as e:
        protocol.parse_request("/v1/completions", b'{"prompt": "x", "model": "gpt-4"}', NAME)
    assert e.value.status == 404 and "gpt-4" in str(e.value) and NAME in str(e.value)


@pytest.mark.parametrize("stops, pieces, text, stopped", [
    (["END"], ["ab", "cE", "N", "Dxyz"], "abc", True),  # split over three pieces
    (["END"], ["ab", "cE", "Nx"], "abcENx", False),  # a false start is released once it breaks
    (["\n\n", "zz"], ["a", "\n", "b\n", "\nc"], "a\nb", True),
    ([], ["a", "b"], "ab", False),
])
def test_stop_strings_cut_text_and_never_show_a_partial_stop(stops, pieces, text, stopped):
    out = protocol.Output(TOK, protocol.CompletionRequest(prompt="x", stop=stops))
    released = []
    for piece in pieces:
        released.append(out._release(piece))
        assert not any(s[:k] and "".join(released).endswith(s) for s in stops for k in (len(s),))
    released.append(out.flush() if not out.stopped else "")
    assert "".join(released) == text and out.stopped == stopped


# ====================================================================== the real server

SERVER = dict(preset="tiny", policy="continuous", port=0, max_batch=8, max_queue=32, block_size=16,
              max_model_len=256, threads=1, drain_s=2.0, api_key=KEY, served_model_name=NAME,
              max_body_bytes=LIMIT)


@pytest.fixture(scope="module")
def server():
    with start_server(ServerConfig(**SERVER)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _idle(server) -> dict:
    """Metrics once nothing runs (a cancelled or stopped sequence frees its blocks at the next step)."""
    for _ in range(100):
        m = server.metrics()
        if sample(m, "vllm:num_requests_running") == 0 and m["labkit_kv_blocks_used"] == 0:
            return m
        time.sleep(0.05)
    return m


def test_openai_completions_stream_and_not_with_stop(server, client):
    full = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True})
    text = full.choices[0].text
    assert full.model == NAME and full.choices[0].finish_reason == "length" and len(text) > 8
    stop = text[4:7]
    cut = text[: text.find(stop)]
    stopped = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop, "\x00"],
                                        extra_body={"ignore_eos": True})
    assert stopped.choices[0].text == cut and stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens < 24
    chunks = list(client.completions.create(model=NAME, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == cut
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == stopped.usage.completion_tokens
    m = _idle(server)
    assert m["labkit_kv_blocks_used"] == 0 and m['labkit_requests_total{status="cancelled"}'] == 0, \
        "a stop string ends the request as completed and frees its blocks"


def test_openai_chat_stream_and_not(client):
    messages = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Tell me one."}]
    full = client.chat.completions.create(model=NAME, messages=messages, max_tokens=12, temperature=0)
    assert full.object == "chat.completion" and full.choices[0].message.role == "assistant"
    assert full.usage.prompt_tokens == len(TOK.encode(protocol.chat_prompt(messages)))
    chunks = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].object == "chat.completion.chunk"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens
    lp = client.chat.completions.create(model=NAME, messages=messages, max_tokens=5, temperature=0, logprobs=True,
                                        top_logprobs=3, extra_body={"ignore_eos": True})
    content = lp.choices[0].logprobs.content
    assert len(content) == 5 and "".join(t.token for t in content) == lp.choices[0].message.content
    for t in content:  # greedy: the chosen token is the most likely alternative
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert max(t.top_logprobs, key=lambda a: a.logprob).token == t.token


def test_completion_logprobs_agree_with_echoed_prompt_logprobs(client):
    """Two code paths: the engine's paged decode gives a token's logprob while generating;
    echo + max_tokens=0 (lm-eval's loglikelihood request) recomputes it in one causal pass."""
    gen = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2,
                                    extra_body={"ignore_eos": True})
    lp = gen.choices[0].logprobs
    assert len(lp.tokens) == 4 and "".join(lp.tokens) == gen.choices[0].text
    assert all(max(top, key=top.get) == tok for tok, top in zip(lp.tokens, lp.top_logprobs))  # greedy
    ids = TOK.encode(PROMPT) + TOK.encode(gen.choices[0].text)
    echo = client.completions.create(model=NAME, prompt=[ids], max_tokens=0, echo=True, logprobs=1)
    got = echo.choices[0].logprobs
    assert echo.choices[0].text == TOK.decode(ids) and echo.usage.completion_tokens == 0
    assert got.token_logprobs[0] is None and len(got.token_logprobs) == len(ids)
    n = len(TOK.encode(PROMPT))
    assert got.token_logprobs[n:] == pytest.approx(lp.token_logprobs, abs=2e-3)
    assert got.text_offset[0] == 0 and got.text_offset[1] == len(got.tokens[0])
    assert all(v <= 0 for v in got.token_logprobs[1:]) and math.isfinite(sum(got.token_logprobs[1:]))


def test_tokenize_detokenize_version_and_model_card(server):
    r = httpx.post(server.url + "/tokenize", json={"model": NAME, "prompt": PROMPT}, headers=AUTH)
    assert r.status_code == 200 and r.json()["tokens"] == TOK.encode(PROMPT) and r.json()["max_model_len"] == 256
    chat = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}, headers=AUTH)
    assert chat.json()["count"] == len(TOK.encode("User: Hi\n\nAssistant:"))
    back = httpx.post(server.url + "/detokenize", json={"tokens": r.json()["tokens"]}, headers=AUTH)
    assert back.json() == {"prompt": PROMPT}
    assert httpx.get(server.url + "/version").json()["version"]
    card = httpx.get(server.url + f"/v1/models/{NAME}", headers=AUTH).json()
    assert card["id"] == NAME and httpx.get(server.url + "/v1/models", headers=AUTH).json()["data"][0]["id"] == NAME


def _post(server, path="/v1/completions", body=None, headers=None, content=None):
    kw = {"content": content} if content is not None else {"json": body}
    return httpx.post(server.url + path, headers=AUTH if headers is None else headers, timeout=60, **kw)


def test_every_bad_input_gets_its_status_and_an_openai_error(server):
    surrogate = b'{"prompt": "a\\ud800"}'
    cases = [
        # (response, status, param, words in the message)
        (_post(server, body={"prompt": "x"}, headers={}), 401, None, "API key"),
        (_post(server, body={"prompt": "x"}, headers={"Authorization": "Bearer wrong"}), 401, None, "API key"),
        (_post(server, content=surrogate, headers=dict(AUTH, **{"Content-Type": "application/json"})), 400,
         "prompt", "surrogate"),
        (_post(server, body={"prompt": "x", "model": "gpt-4"}), 404, "model", "'gpt-4' does not exist"),
        (_post(server, body={"prompt": "x", "seed": 2 ** 70}), 400, "seed", "[-2**63, 2**64)"),
        (_post(server, body={"prompt": "x", "n": 2}), 400, "n", "'n' is not supported"),
        (_post(server, content=b'{"prompt": "x"}', headers=dict(AUTH, **{"Content-Type": "text/plain"})), 415,
         "content-type", "must be application/json"),
        (_post(server, content=b'{"prompt": "x"}', headers=dict(AUTH, **{"Content-Type": ""})), 415,
         "content-type", "got 'none'"),
        (_post(server, body={"prompt": "x" * LIMIT}), 413, "body", f"at most {LIMIT} bytes"),
        (httpx.get(server.url + "/v1/completions", headers=AUTH), 405, None, "allowed: POST"),
        (httpx.get(server.url + "/v1/nothing", headers=AUTH), 404, None, "no endpoint GET /v1/nothing"),
        (httpx.get(server.url + "/v1/models/gpt-4", headers=AUTH), 404, "model", "does not exist"),
        (_post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "model": "no"}),
         404, "model", "does not exist"),
        (_post(server, "/detokenize", {"tokens": [10 ** 9]}), 400, "tokens", "token ids in [0,"),
    ]
    for r, status, param, words in cases:
        assert r.status_code == status, (status, r.status_code, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["param"] == param, err
        assert words in err["message"], err
    assert httpx.get(server.url + "/health").status_code == 200, "probes need no key"
    assert httpx.get(server.url + "/v1/models").status_code == 401


def test_chunked_body_past_the_limit_is_413(server):
    def body():
        for _ in range(4):
            yield b" " * (LIMIT // 2)
        yield b'{"prompt": "x"}'

    r = httpx.post(server.url + "/v1/completions", content=body(), timeout=60,
                   headers=dict(AUTH, **{"Content-Type": "application/json"}))
    assert r.status_code == 413 and r.json()["error"]["param"] == "body"


def _raw_oversized_post(port: int, size: int, sent_before_reading: int) -> tuple[int, int]:
    """POST announcing a `size`-byte body, send only `sent_before_reading` bytes of it, then read
    the status line: (status, bytes of body sent)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n").encode()
    s.sendall(head + b'{"prompt": "' + b"x" * (sent_before_reading - 12))
    status = int(s.makefile("rb").readline().split()[1])
    s.close()
    return status, sent_before_reading


def _stream_around_a_refusal(url: str, port: int, max_tokens: int) -> tuple[int, int, list[float], float, float]:
    """Start a stream of `max_tokens` tokens; after its 10th chunk send a 10 MB body (64 KiB of it).
    Returns the 413's status, bytes sent, the stream's chunk arrival times (s), and when the
    oversized request was sent and refused (s)."""
    arrivals: list[float] = []

    def stream() -> None:
        with httpx.stream("POST", url + "/v1/completions", headers=AUTH, timeout=60,
                          json={"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.monotonic())

    t = threading.Thread(target=stream)
    t.start()
    while len(arrivals) < 10 and t.is_alive():
        time.sleep(0.01)
    sent_at = time.monotonic()
    status, sent = _raw_oversized_post(port, 10 * 1024 * 1024, 64 * 1024)
    refused_at = time.monotonic()
    t.join(60)
    assert len(arrivals) == max_tokens + 1, "the concurrent stream finished (its tokens + the finish chunk)"
    return status, sent, arrivals, sent_at, refused_at


def test_a_10_mb_body_is_refused_unread_while_a_stream_keeps_flowing(server):
    """The 10 MB request is answered 413 from its headers, after 64 KiB of its body were sent:
    the server never reads, tokenizes or buffers it, so it cannot stall anyone. A concurrent
    stream keeps receiving tokens before and after the refusal. The stream must outlast the
    refusal for the test to mean anything: on a machine that streams faster than a 413 round
    trip, the stream gets longer (up to the server's context), never the clock shorter."""
    for max_tokens in (60, 120, 240):  # PROMPT + 240 tokens fit the test server's 256-token context
        status, sent, arrivals, sent_at, refused_at = _stream_around_a_refusal(server.url, server.port, max_tokens)
        assert status == 413 and sent < 10 * 1024 * 1024
        if any(a > refused_at for a in arrivals):
            break
    else:
        pytest.skip(f"a {max_tokens}-token stream ended before one 413 round trip on this machine: nothing overlaps")
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    # The refusal costs the server a header parse, not a body read: the stream's largest gap
    # around it is bounded by the stream's own largest gap elsewhere (scheduling noise on a
    # shared machine) rather than by a fixed time.
    window = lambda a, g: a + g >= sent_at and a <= refused_at  # noqa: E731 (gap overlaps the refusal)
    around = [g for a, g in zip(arrivals, gaps) if window(a, g)]
    elsewhere = [g for a, g in zip(arrivals, gaps) if not window(a, g)]
    assert max(around, default=0) <= max(0.1, 2 * max(elsewhere)), (around, max(elsewhere))
    m = _idle(server)
    assert m["labkit_kv_blocks_used"] == 0


def test_guidellm_style_stream_reports_usage_in_every_chunk(server):
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 6, "ignore_eos": True, "stream": True, "top_k": -1,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    text_chunks = [e for e in events if e["choices"]]
    assert all("usage" in e for e in text_chunks)
    assert events[-1]["usage"]["completion_tokens"] == 6 and not events[-1]["choices"]
    counts = [e["usage"]["completion_tokens"] for e in text_chunks]
    assert counts == sorted(counts) and counts[-1] == 6
