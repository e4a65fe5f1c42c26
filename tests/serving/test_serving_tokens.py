"""``turnrl.serving``: the bearer-token check every turnrl server shares, on a real server
(an ``HTTPService`` with one small real route, bound to all interfaces and reached over loopback).

The per-server tests (env, tool and policy servers, their clients and command lines) are in
``tests/envs/test_remote_env.py``, ``tests/tools/test_remote_tools.py`` and
``tests/policies/test_policy_server.py``."""

import http.client
import json

import httpx
import pytest

from fastapi import Request

from turnrl.serving import (HTTPService, JSONReply, check_token, is_loopback, refused_message, server_token,
                            service_app, token_from_env)

TOKEN = "tok-3f9a2b7c1d"


class Echo(HTTPService):
    """Replies to GET and POST on any path with the method, path and body length."""

    def __init__(self, host, token=None):
        super().__init__(host, 0, "echo", token=token)

    def build_app(self):
        import logging

        app = service_app(title="echo server", token=self._token, max_body_bytes=1 << 20, endpoints="any",
                          logger=logging.getLogger("echo"))

        @app.api_route("/{path:path}", methods=["GET", "POST"])
        async def echo(request: Request, path: str):
            body = await request.body()
            return JSONReply({"method": request.method, "path": f"/{path}", "body_bytes": len(body)})

        return app


@pytest.fixture
def served():
    """A token-guarded server on 0.0.0.0 (every interface: not loopback) and its loopback URL."""
    with Echo("0.0.0.0", token=TOKEN) as server:
        yield f"http://127.0.0.1:{server.port}"


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.9.8.7", True), ("localhost", True),
                                            ("LocalHost", True), ("::1", True), ("[::1]", True),
                                            ("0.0.0.0", False), ("", False), ("::", False), ("192.0.2.2", False),
                                            ("10.0.0.1", False), ("example.org", False)])
def test_loopback_is_127_8_and_ipv6_1_and_localhost_only(host, loopback):
    assert is_loopback(host) is loopback


def test_a_non_loopback_bind_without_a_token_is_refused_saying_how_to_set_one():
    for host in ("0.0.0.0", "192.0.2.2", ""):
        with pytest.raises(ValueError, match=rf"refusing to serve on '{host}' without a token.*"
                                             r"export TURNRL_SERVER_TOKEN=.*or bind 127\.0\.0\.1"):
            Echo(host)
    with Echo("127.0.0.1") as server:  # loopback: a token is optional
        assert httpx.get(f"{server.url}/x").json()["path"] == "/x"


def test_requests_without_the_right_token_get_401_with_www_authenticate(served):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": TOKEN}, {"Authorization": f"Bearer {TOKEN}x"},
                    {"Authorization": f"Bearer {TOKEN[:-1]}"}, {"Authorization": "Bearer"}):
        for method in ("GET", "POST"):
            reply = httpx.request(method, f"{served}/anything", headers=headers, json={"a": 1})
            assert reply.status_code == 401, (method, headers)
            assert reply.headers["WWW-Authenticate"] == "Bearer"
            assert "send 'Authorization: Bearer <token>'" in reply.json()["error"]["message"]
            assert TOKEN not in reply.text
    ok = httpx.post(f"{served}/anything", headers={"Authorization": f"Bearer {TOKEN}"}, content=b'{"a": 1}')
    assert ok.json() == {"method": "POST", "path": "/anything", "body_bytes": 8}
    assert reply.json()["error"]["type"] == "authentication_error" and reply.json()["error"]["code"] == 401
    assert httpx.get(f"{served}/x", headers={"Authorization": f"bearer {TOKEN}"}).status_code == 200  # any case


def test_health_stays_open_and_nothing_else_does(served):
    assert httpx.get(f"{served}/health").json() == {"status": "ok"}
    assert httpx.post(f"{served}/health").status_code == 401  # only GET /health is open
    assert httpx.get(f"{served}/health/x").status_code == 401


def test_a_refused_request_leaves_the_connection_usable(served):
    """The refused request's body is read and dropped, so the next request on the same
    keep-alive connection is parsed as a request (not as the rest of the old body)."""
    host, port = served.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", "/first", body=json.dumps({"pad": "x" * 5000}),
                     headers={"Content-Type": "application/json"})
        first = conn.getresponse()
        assert first.status == 401 and first.getheader("Connection") != "close"
        first.read()
        conn.request("GET", "/second", headers={"Authorization": f"Bearer {TOKEN}"})
        second = conn.getresponse()
        assert second.status == 200 and json.loads(second.read())["path"] == "/second"
    finally:
        conn.close()


def test_tokens_must_fit_a_header_and_the_message_never_shows_them(monkeypatch):
    for bad in ("", "has space", "new\nline", "tab\t", "caf\u00e9"):
        with pytest.raises(ValueError, match="make a token with") as err:
            check_token(bad, "the environment variable X")
        assert not bad or bad not in str(err.value)
        with pytest.raises(ValueError):
            Echo("127.0.0.1", token=bad)
    monkeypatch.setenv("TURNRL_TEST_TOKEN", f"{TOKEN}\n")
    with pytest.raises(ValueError, match="the environment variable TURNRL_TEST_TOKEN holds whitespace"):
        token_from_env("TURNRL_TEST_TOKEN")
    monkeypatch.setenv("TURNRL_TEST_TOKEN", TOKEN)
    assert token_from_env("TURNRL_TEST_TOKEN") == TOKEN
    monkeypatch.setenv("TURNRL_TEST_TOKEN", "")
    assert token_from_env("TURNRL_TEST_TOKEN") is None and token_from_env(None) is None


def test_server_token_reads_the_named_variable_and_the_default_one(monkeypatch):
    monkeypatch.delenv("TURNRL_SERVER_TOKEN", raising=False)
    monkeypatch.delenv("TURNRL_TEST_TOKEN", raising=False)
    assert server_token(None, "127.0.0.1") is None  # loopback, no variable: no token
    with pytest.raises(ValueError, match="TURNRL_TEST_TOKEN \\(named by --token-env\\) is unset or empty"):
        server_token("TURNRL_TEST_TOKEN", "127.0.0.1")
    with pytest.raises(ValueError, match="refusing to serve on '0.0.0.0'.*export TURNRL_SERVER_TOKEN="):
        server_token(None, "0.0.0.0")
    monkeypatch.setenv("TURNRL_SERVER_TOKEN", TOKEN)
    assert server_token(None, "0.0.0.0") == TOKEN
    monkeypatch.setenv("TURNRL_TEST_TOKEN", "other")
    assert server_token("TURNRL_TEST_TOKEN", "0.0.0.0") == "other"


def test_the_client_message_names_the_variable_to_set():
    url = "http://10.0.0.2:8000"
    assert refused_message(url, "MY_TOKEN", True) == f"the server at {url} refused the token: set MY_TOKEN to its token"
    assert "MY_TOKEN was unset or empty, so no token was sent" in refused_message(url, "MY_TOKEN", False)
    assert "name the environment variable that holds it" in refused_message(url, None, False)
