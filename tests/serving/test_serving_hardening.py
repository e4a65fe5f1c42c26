"""``turnrl.serving`` against bad input and slow clients, on a bare ``HTTPService`` with a few
real routes (the env, tool and policy servers' own suites are ``tests/envs/test_server_trust.py``,
``tests/tools/test_remote_tools.py`` and ``tests/policies/test_policy_server_limits.py``). Real
servers over real sockets; nothing is mocked.

What every server answers whatever its routes: ``GET /health``; 400 for a ``Content-Length``
that is not one non-negative integer, JSON nested too deeply or with an integer of thousands of
digits (also where a route decodes the body itself), a body that fails the route's model; 405
for a method a path does not take, 404 for an unknown path; every refusal in the one error
format; and a connection that does not deliver its next request in time is closed.
"""

import json
import logging
import socket
import time

import httpx
import pytest
from fastapi import Request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from turnrl.serving import MAX_JSON_DEPTH, HTTPService, JSONReply, parse_json, service_app
from turnrl.tools.calculator import calculator
from turnrl.tools.serve import ToolServer

from tests.helpers import read_reply


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    n: int
    tags: list[str] = []


class Bare(HTTPService):
    """``/raw`` decodes its body with ``json.loads`` itself; ``/item`` takes a pydantic model;
    ``/bug`` is a bug of the server."""

    def __init__(self, read_timeout_s=30.0, max_connections=4096):
        super().__init__("127.0.0.1", 0, "bare", read_timeout_s=read_timeout_s, max_connections=max_connections)

    def build_app(self):
        app = service_app(title="bare server", token=None, max_body_bytes=1 << 16, endpoints="POST /raw, POST /item",
                          logger=logging.getLogger("bare"))

        @app.post("/raw")
        async def raw(request: Request):
            return JSONReply({"got": json.loads(await request.body())})

        @app.post("/item")
        def item(body: Item):
            return JSONReply({"n": body.n, "tags": body.tags})

        @app.post("/bug")
        def bug():
            raise KeyError("a bug of the server")

        return app


@pytest.fixture(scope="module")
def bare():
    with Bare() as server:
        yield server


def exchange(port: int, data: bytes) -> tuple[int | None, dict[str, str], bytes]:
    """Send raw bytes on a new connection; the reply's status (None: none came), headers and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        return read_reply(sock)


def post(path: str, body: bytes, **headers: str) -> bytes:
    head = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    if "Content_Length" not in headers:
        head += f"Content-Length: {len(body)}\r\n"
    return f"POST {path} HTTP/1.1\r\nHost: t\r\n{head}\r\n".encode("latin-1") + body


def error_of(body: bytes) -> dict:
    """The ``error`` object of a reply, checked to have the one format."""
    error = json.loads(body)["error"]
    assert {"message", "type", "code", "param"} <= set(error), error
    return error


# ------------------------------------------------------------------ parse_json
def test_parse_json_bounds_depth_and_digits():
    assert parse_json(b'{"a": [1, {"b": "x"}]}') == {"a": [1, {"b": "x"}]}
    assert parse_json(b'"[[[["') == "[[[["  # brackets inside a string are text
    deep_ok = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert parse_json(deep_ok) is not None
    for raw, words in [(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), "nests deeper than 64"),
                       (b"[" * 100_000 + b"]" * 100_000, "nests deeper than 64"),
                       (b'{"seed": ' + b"9" * 5000 + b"}", "an integer of more than 4300 digits"),
                       (b"\xff\xfe{", "not valid UTF-8 JSON"), (b"{", "not valid UTF-8 JSON")]:
        with pytest.raises(ValueError, match=words):
            parse_json(raw)
    assert parse_json(b"[[1]]", max_depth=2) == [[1]]
    with pytest.raises(ValueError, match="deeper than 1 levels"):
        parse_json(b"[[1]]", max_depth=1)


def test_the_read_timeout_must_be_positive():
    for bad in (0, -1, float("nan"), True, "30"):
        with pytest.raises(ValueError, match="read_timeout_s must be a positive number"):
            Bare(read_timeout_s=bad)


# ------------------------------------------------------------- a bare server
def test_health_404_405_and_unknown_methods_in_the_one_format(bare):
    assert httpx.get(f"{bare.url}/health").json() == {"status": "ok"}
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        reply = httpx.request(method, f"{bare.url}/health")
        assert reply.status_code == 405 and "use GET" in error_of(reply.content)["message"]
    missing = httpx.get(f"{bare.url}/nothing")
    assert missing.status_code == 404 and error_of(missing.content)["type"] == "not_found_error"
    assert "the endpoints are: POST /raw, POST /item" in error_of(missing.content)["message"]
    status, _, body = exchange(bare.port, b"OPTIONS /raw HTTP/1.1\r\nHost: t\r\n\r\n")
    assert status == 405 and error_of(body)["message"] == "OPTIONS is not allowed on /raw; use POST"
    status, _, body = exchange(bare.port, b"BREW /raw HTTP/1.1\r\nHost: t\r\n\r\n")  # no HTTP method at all
    assert status == 400 and "not HTTP/1.1 this server reads" in error_of(body)["message"]


def test_a_body_that_fails_its_model_is_400_naming_the_field(bare):
    for body, param, words in [({"n": "1"}, "n", "Input should be a valid integer"),
                               ({"n": True}, "n", "Input should be a valid integer"),
                               ({}, "n", "Field required"), ({"n": 1, "x": 0}, "x", "Extra inputs are not permitted"),
                               ({"n": 1, "tags": [1]}, "tags[0]", "Input should be a valid string"),
                               ([1], None, "the body must be a JSON object, got array")]:
        reply = httpx.post(f"{bare.url}/item", json=body)
        error = error_of(reply.content)
        assert (reply.status_code, error["code"], error["param"]) == (400, 400, param), (body, error)
        assert error["message"].startswith("bad body for POST /item: ") and words in error["message"], error
    assert httpx.post(f"{bare.url}/item", json={"n": 3}).json() == {"n": 3, "tags": []}
    # no body, or no content type (as `curl -d` sends), is read as JSON all the same
    assert error_of(httpx.post(f"{bare.url}/item").content)["param"] == "n"
    form = httpx.post(f"{bare.url}/item", content=b'{"n": 4}', headers={"Content-Type": "text/plain"})
    assert form.json() == {"n": 4, "tags": []}


def test_input_python_refuses_is_400_even_where_a_route_decodes_it_itself(bare):
    for path in ("/raw", "/item"):
        for body, words in [(b"[" * 30_000 + b"]" * 30_000, "nests deeper than 64"),
                            (b'{"n": ' + b"9" * 5000 + b"}", "more than 4300 digits"),
                            (b"{not json", "not valid UTF-8 JSON")]:
            status, _, reply = exchange(bare.port, post(path, body))
            assert status == 400 and words in error_of(reply)["message"], (path, reply)
    bug = httpx.post(f"{bare.url}/bug", json={})
    assert bug.status_code == 500 and "KeyError" in error_of(bug.content)["message"]  # a real bug is a 500
    assert error_of(bug.content)["type"] == "server_error"
    assert httpx.post(f"{bare.url}/raw", json={"a": 1}).json() == {"got": {"a": 1}}


@pytest.mark.parametrize("value", ["abc", "-1", "+5", "1.0", "0x10", " ", "9" * 19,
                                   "\u00b9"])  # "¹", a digit to str.isdigit
def test_a_content_length_that_is_not_a_plain_integer_is_400_and_closes(bare, value):
    status, headers, body = exchange(bare.port, post("/raw", b"{}", Content_Length=value))
    assert status == 400 and "Content-Length must be one non-negative integer" in error_of(body)["message"]
    assert headers["connection"] == "close"
    assert httpx.get(f"{bare.url}/health").status_code == 200


def test_chunked_bodies_other_http_versions_and_oversized_bodies_are_4xx(bare):
    status, headers, body = exchange(bare.port, b"POST /raw HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
                                                b"\r\n2\r\n{}\r\n0\r\n\r\n")
    assert status == 411 and headers["connection"] == "close" and "Content-Length" in error_of(body)["message"]
    for data in [b"GARBAGE\r\n\r\n", b"GET /health HTTP/2.0\r\nHost: t\r\n\r\n", b"GET /health HTTP/9\r\n\r\n"]:
        status, _, body = exchange(bare.port, data)
        assert status == 400 and error_of(body)["code"] == 400, (data, body)
    status, _, body = exchange(bare.port, post("/raw", b"[" + b"1," * 40_000 + b"1]"))
    assert status == 413 and f"at most {1 << 16} are accepted" in error_of(body)["message"]
    assert httpx.get(f"{bare.url}/health").status_code == 200


def test_a_slow_route_is_not_cut_by_the_read_deadline():
    """The deadline covers the request's arrival, not the route's work."""
    class Slow(Bare):
        def build_app(self):
            app = super().build_app()

            @app.post("/slow")
            def slow():
                time.sleep(1.0)
                return JSONReply({"done": True})

            return app

    with Slow(read_timeout_s=0.3) as server:
        assert httpx.post(f"{server.url}/slow", json={}, timeout=10).json() == {"done": True}


def test_connections_beyond_the_cap_get_503_and_the_server_serves_on():
    with Bare(max_connections=3) as server:
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3)]
        time.sleep(0.2)  # the server has accepted them
        status, headers, body = exchange(server.port, b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        assert status == 503 and headers["connection"] == "close", body
        assert "holds 3 connections" in error_of(body)["message"] and error_of(body)["type"] == "overloaded_error"
        held.pop().close()
        time.sleep(0.2)
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
        for sock in held:
            sock.close()
    with pytest.raises(ValueError, match="max_connections must be a positive int or None"):
        Bare(max_connections=0)


@pytest.mark.slow
def test_connections_that_do_not_deliver_a_request_in_time_are_closed():
    with Bare(read_timeout_s=0.4) as server:
        socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
        socks[0].sendall(post("/raw", b"", Content_Length="50") + b"{")  # a body that never completes
        socks[1].sendall(b"POST /raw HTTP/1.1\r\nHost: t\r\n")  # headers that never end
        start = time.monotonic()
        for sock in socks:
            sock.settimeout(max(0.01, 3 - (time.monotonic() - start)))
            try:
                while sock.recv(4096):
                    pass
            except TimeoutError:
                pytest.fail(f"a connection still open after {time.monotonic() - start:.1f} s")
            finally:
                sock.close()
        with httpx.Client(base_url=server.url) as client:  # a client that keeps up is served as before
            for _ in range(3):
                assert client.post("/raw", json=[1]).json() == {"got": [1]}
                time.sleep(0.1)


SCALARS = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=20))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                              max_size=4),
                         max_leaves=12),
       raw=st.binary(max_size=64))
def test_fuzzed_bodies_get_a_4xx_or_200_never_a_5xx(bare, body, raw):
    with httpx.Client(base_url=bare.url) as client:
        for reply in (client.post("/item", json=body), client.post("/item", content=raw)):
            assert reply.status_code in (200, 400), reply.text
            if reply.status_code == 400:
                error_of(reply.content)
        assert client.get("/health").status_code == 200


# ------------------------------------------------------------- the tool server
@pytest.mark.slow
def test_the_tool_server_refuses_bad_input_in_the_error_format():
    with ToolServer([calculator], read_timeout_s=5) as server:
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
        call = {"name": "calculator", "arguments": {"expression": "1+2"}}
        for method in ("PUT", "DELETE", "PATCH"):  # once, any method but GET ran the call
            reply = httpx.request(method, f"{server.url}/call", json=call)
            assert reply.status_code == 405 and reply.json()["error"]["type"] == "invalid_request_error", method
            assert "use POST" in reply.json()["error"]["message"]
        assert httpx.post(f"{server.url}/tools").status_code == 405
        for body, words in [(b"[" * 100_000 + b"]" * 100_000, "nests deeper than 64"),
                            (b'{"name": "calculator", "arguments": {"x": ' + b"1" * 5000 + b"}}", "4300 digits")]:
            status, _, reply = exchange(server.port, post("/call", body))
            error = error_of(reply)
            assert (status, error["code"], error["type"]) == (400, 400, "invalid_request_error")
            assert words in error["message"]
        # no body at all is the body {}, which names no tool
        status, _, reply = exchange(server.port, b"POST /call HTTP/1.1\r\nHost: t\r\n\r\n")
        assert status == 400 and error_of(reply)["param"] == "name"
        status, _, reply = exchange(server.port, b"POST /call HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
                                                 b"\r\n2\r\n{}\r\n0\r\n\r\n")
        assert status == 411 and "Content-Length" in error_of(reply)["message"]
        status, _, reply = exchange(server.port, post("/call", b"{" + b" " * (4 * 1024 * 1024) + b"}"))
        assert status == 413 and error_of(reply)["code"] == 413
        status, _, reply = exchange(server.port, b"BREW /tools HTTP/1.1\r\nHost: t\r\n\r\n")
        assert status == 400 and error_of(reply)["type"] == "invalid_request_error"
        assert httpx.post(f"{server.url}/call", json=call).json() == {"content": "3", "error": None}


# ----------------------------------------------------------- the policy server
@pytest.mark.slow
def test_the_policy_server_gets_health_and_400s_from_the_base(tiny_model, tokenizer):
    from turnrl.policies.server import PolicyServer

    with PolicyServer(tiny_model, tokenizer, batch_window_s=0) as server:
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
        for body in (b"[" * 100_000 + b"]" * 100_000, b'{"prompt": [1], "max_tokens": ' + b"9" * 5000 + b"}"):
            status, _, reply = exchange(server.port, post("/v1/completions", body))
            assert status == 400 and error_of(reply)["code"] == 400, reply[:300]
        status, _, _ = exchange(server.port, post("/v1/completions", b"{}", Content_Length="abc"))
        assert status == 400
        assert httpx.get(f"{server.url}/v1/models").status_code == 200
