"""``turnrl.http_json`` against bad input and slow clients, for every server built on it: a bare
``JSONServer``, the tool server and the policy server (the env server's own suite is
``tests/envs/test_server_trust.py``). Real servers over real sockets; nothing is mocked.

What every server answers whatever its routes: ``GET /health``; 400 for a ``Content-Length``
that is not one non-negative integer, JSON nested too deeply or with an integer of thousands of
digits (also where a route decodes the body itself); 405 for a method no endpoint takes; and a
connection that does not deliver its next request in time is closed.
"""

import json
import socket
import time

import httpx
import pytest

from turnrl.http_json import JSONHandler, JSONServer, MAX_JSON_DEPTH, parse_json
from turnrl.tools.calculator import calculator
from turnrl.tools.serve import ToolServer


class DecodingHandler(JSONHandler):
    """Decodes bodies itself with ``json.loads`` (as the policy server does); ``/bug`` is a server bug."""

    def route(self, method, path):
        if path == "/bug":
            raise KeyError("a bug of the server")
        if path == "/checked":
            return {"got": self.read_json()}
        return {"got": json.loads(self.read_body() or b"null")}


def exchange(port: int, data: bytes) -> tuple[int | None, dict[str, str], bytes]:
    """Send raw bytes on a new connection; the reply's status (None: none came), headers and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                return None, {}, buf
            buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        while len(body) < int(headers.get("content-length", 0)):
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return int(lines[0].split()[1]), headers, body


def post(path: str, body: bytes, **headers: str) -> bytes:
    head = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    if "Content_Length" not in headers:
        head += f"Content-Length: {len(body)}\r\n"
    return f"POST {path} HTTP/1.1\r\nHost: t\r\n{head}\r\n".encode("latin-1") + body


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
            JSONServer("127.0.0.1", 0, DecodingHandler, "x", read_timeout_s=bad)


# ------------------------------------------------------------- a bare server
@pytest.mark.slow
def test_every_server_answers_health_and_405_for_other_methods_on_it():
    with JSONServer("127.0.0.1", 0, DecodingHandler, "bare") as server:
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            reply = httpx.request(method, f"{server.url}/health")
            assert reply.status_code == 405 and "use GET" in reply.json()["error"]
        status, _, body = exchange(server.port, b"BREW /pot HTTP/1.1\r\nHost: t\r\n\r\n")
        assert status == 405 and json.loads(body) == {"error": "the method 'BREW' is not supported"}


@pytest.mark.slow
def test_input_python_refuses_is_400_even_where_a_route_decodes_it_itself():
    with JSONServer("127.0.0.1", 0, DecodingHandler, "bare") as server:
        for path in ("/raw", "/checked"):
            for body, words in [(b"[" * 100_000 + b"]" * 100_000, "deep"),
                                (b'{"n": ' + b"9" * 5000 + b"}", "more than 4300 digits")]:
                status, _, reply = exchange(server.port, post(path, body))
                assert status == 400 and words in json.loads(reply)["error"], (path, reply)
        status, _, reply = exchange(server.port, post("/checked", b"[" * 70 + b"]" * 70))
        assert status == 400 and "nests deeper than 64" in json.loads(reply)["error"]
        bug = httpx.post(f"{server.url}/bug", json={})
        assert bug.status_code == 500 and "KeyError" in bug.json()["error"]  # a real bug is still a 500
        assert httpx.post(f"{server.url}/raw", json={"a": 1}).json() == {"got": {"a": 1}}


@pytest.mark.slow
@pytest.mark.parametrize("value", ["abc", "-1", "+5", "1.0", "0x10", " ", "9" * 19,
                                   "\u00b9"])  # "¹", a digit to str.isdigit
def test_a_content_length_that_is_not_a_plain_integer_is_400_and_closes(value):
    with JSONServer("127.0.0.1", 0, DecodingHandler, "bare") as server:
        status, headers, body = exchange(server.port, post("/raw", b"{}", Content_Length=value))
        assert status == 400 and "Content-Length must be one non-negative integer" in json.loads(body)["error"]
        assert headers["connection"] == "close"
        assert httpx.get(f"{server.url}/health").status_code == 200


@pytest.mark.slow
def test_connections_that_do_not_deliver_a_request_in_time_are_closed():
    with JSONServer("127.0.0.1", 0, DecodingHandler, "bare", read_timeout_s=0.4) as server:
        socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
        socks[0].sendall(post("/raw", b"", Content_Length="50") + b"{")  # a body that never completes
        start = time.monotonic()
        for sock in socks:
            sock.settimeout(max(0.01, 3 - (time.monotonic() - start)))
            try:
                while sock.recv(4096):  # a 408 may come first, then the end
                    pass
            except TimeoutError:
                pytest.fail(f"a connection still open after {time.monotonic() - start:.1f} s")
            finally:
                sock.close()
        with httpx.Client(base_url=server.url) as client:  # a client that keeps up is served as before
            for _ in range(3):
                assert client.post("/raw", json=[1]).json() == {"got": [1]}
                time.sleep(0.1)


# ------------------------------------------------------------- the tool server
@pytest.mark.slow
def test_the_tool_server_refuses_bad_input_in_its_own_protocol():
    with ToolServer([calculator], read_timeout_s=5) as server:
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
        call = {"name": "calculator", "arguments": {"expression": "1+2"}}
        for method in ("PUT", "DELETE", "PATCH"):  # once, any method but GET ran the call
            reply = httpx.request(method, f"{server.url}/call", json=call)
            assert reply.status_code == 405 and reply.json()["error"] == "bad_request", method
        assert httpx.post(f"{server.url}/tools").status_code == 405
        for body, words in [(b"[" * 100_000 + b"]" * 100_000, "nests deeper than 64"),
                            (b'{"name": "calculator", "arguments": {"x": ' + b"1" * 5000 + b"}}", "4300 digits")]:
            status, _, reply = exchange(server.port, post("/call", body))
            assert status == 400 and json.loads(reply)["error"] == "bad_request"
            assert words in json.loads(reply)["message"]
        status, _, reply = exchange(server.port, b"POST /call HTTP/1.1\r\nHost: t\r\n\r\n")
        assert status == 411 and "Content-Length" in json.loads(reply)["message"]
        status, _, reply = exchange(server.port, b"BREW /tools HTTP/1.1\r\nHost: t\r\n\r\n")
        assert status == 405 and json.loads(reply)["error"] == "bad_request"
        assert httpx.post(f"{server.url}/call", json=call).json() == {"content": "3", "error": None}


# ----------------------------------------------------------- the policy server
@pytest.mark.slow
def test_the_policy_server_gets_health_and_400s_from_the_base(tiny_model, tokenizer):
    from turnrl.agents.policy_server import PolicyServer

    with PolicyServer(tiny_model, tokenizer, batch_window_s=0) as server:
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
        for body in (b"[" * 100_000 + b"]" * 100_000, b'{"prompt": [1], "max_tokens": ' + b"9" * 5000 + b"}"):
            status, _, reply = exchange(server.port, post("/v1/completions", body))
            assert status == 400 and json.loads(reply)["error"]["code"] == 400, reply[:300]
        status, _, _ = exchange(server.port, post("/v1/completions", b"{}", Content_Length="abc"))
        assert status == 400
        assert httpx.get(f"{server.url}/v1/models").status_code == 200
