"""The secrets relay of the orchestrator egress gateway: a mitmproxy addon (see
docs/network.md, "Secrets").

Squid sends here only the CONNECT tunnels of its clients to the hosts a secret may be sent
to; everything else never reaches this process. Here TLS is ended with a certificate of the
environment's own CA (which its sandboxes trust), each request's header values have a
secret's placeholder replaced by its value when the request goes to one of that secret's
hosts, and the request leaves through Squid again (its second port, with the same rules),
over TLS verified for that host.

A value is put in only when every name the request carries agrees on the host: the TLS name
the sandbox asked for (SNI), the request's own host (Host or :authority) and its port, and
the request arrived over TLS. So a request cannot be steered, by a name that disagrees, to
another site the same address serves. Only header values get a value: a body or a URL is
what an API stores and shows again (a file upload, an echo), and a header is where keys go.

Every answer has each value put back to its placeholder, in its headers, body and trailers,
so an API that repeats a key shows the sandbox only its placeholder; what cannot be searched
so is cut (a compressed answer too large to hold, a transfer coding, an upgrade, a value in
a status line or a header's name), and mitmproxy's own error pages name nothing a server
sent. A placeholder has its value's length, so a body keeps its length as it streams.
Nothing here logs a request or a value, and no head may pass HEAD_LIMIT."""

from __future__ import annotations

import ctypes
import json
import os

from mitmproxy import http
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers.http import _http1, _http2

HELD_LIMIT = 1024 * 1024
"""The largest compressed answer held whole to decode (the relay's stream_large_bodies)."""
VALUES = os.environ.get("ORCHESTRATOR_RELAY_VALUES", "/etc/orchestrator-gateway/secrets/values.json")


class Secret:
    def __init__(self, placeholder: str, value: str, hosts: list[str]) -> None:
        self.placeholder = placeholder
        self.value = value
        self.hosts = frozenset(h.lower() for h in hosts)
        self.placeholder_bytes = placeholder.encode()
        self.value_bytes = value.encode()


def _load() -> list[Secret]:
    with open(VALUES, encoding="utf-8") as handle:
        raw = json.load(handle)
    out = []
    for item in raw["secrets"]:
        placeholder, value = item["placeholder"], item["value"]
        if len(placeholder) != len(value) or not value.isascii() or not value.isprintable():
            raise ValueError("a placeholder must have its value's length, and a value be printable")
        out.append(Secret(placeholder, value, list(item["hosts"])))
    return out


def _agreed_host(flow: http.HTTPFlow) -> str | None:
    """The host every name of the request agrees on, lower-case; None when any differs or is
    missing, or the request did not come over TLS."""
    request = flow.request
    client = flow.client_conn
    if request.scheme != "https" or not client.tls_established or not client.sni:
        return None
    sni = client.sni.lower().rstrip(".")
    host = (request.host or "").lower().rstrip(".")
    told = (request.host_header or "").lower()
    if told.endswith(":443") and request.port == 443:
        told = told[: -len(":443")]
    told = told.rstrip(".")
    if sni != host or host != told or request.port != 443:
        return None
    return host


class Scrub:
    """Puts each value in a streamed body back to its placeholder; it holds back, at most, a
    value's length less one byte, which a value cut across two pieces needs."""

    def __init__(self, secrets: list[Secret]) -> None:
        self.secrets = secrets
        self.keep = max(len(s.value_bytes) for s in secrets) - 1
        self.held = b""

    def __call__(self, data: bytes) -> bytes | list[bytes]:
        text = self.held + data
        for secret in self.secrets:
            text = text.replace(secret.value_bytes, secret.placeholder_bytes)
        if not data:  # the end
            self.held = b""
            return text
        cut = max(len(text) - self.keep, 0)
        self.held = text[cut:]
        # never an empty piece before the end: HTTP/1 would write it as the last chunk
        return [text[:cut]] if cut else []


def _said_nothing(status_code: int, message: str) -> bytes:
    """mitmproxy's error page, which would quote what the server sent (a header that echoed
    a value, cut short): here it names nothing the server sent."""
    del message
    return (
        b"orchestrator egress gateway: the secrets relay could not pass this answer on "
        b"(%d)\n" % status_code
    )


# mitmproxy's pages of a server's malformed answer, for HTTP/1 and HTTP/2 alike
_http1.format_error = _said_nothing
_http2.format_error = _said_nothing

HEAD_LIMIT = 64 * 1024
"""The most a request's or an answer's head may take (mitmproxy 8.1 sets no bound: a head of
hundreds of MiB took the gateway's memory)."""


def _bounded(read_headers):
    """HTTP/1 head reading that closes a connection whose head runs past HEAD_LIMIT."""

    def bounded(self, event):
        if isinstance(event, events.DataReceived) and len(self.buf) > HEAD_LIMIT:
            if b"\r\n\r\n" not in bytes(self.buf)[: HEAD_LIMIT + 4]:
                yield commands.CloseConnection(self.conn)
                self.state = self.done
                return
        yield from read_headers(self, event)

    return bounded


_http1.Http1Server.read_headers = _bounded(_http1.Http1Server.read_headers)
_http1.Http1Client.read_headers = _bounded(_http1.Http1Client.read_headers)


class Relay:
    def __init__(self) -> None:
        self.secrets = _load()
        # no other process of this user may read this one's memory, environment or files
        # through /proc (PR_SET_DUMPABLE 0)
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        # A body is never changed here: it goes on as it comes, never held whole (so the
        # headers are settled now, before they leave).
        host = _agreed_host(flow)
        mine = [s for s in self.secrets if host is not None and host in s.hosts]
        headers = flow.request.headers
        if not mine:
            if any(s.placeholder in v for s in self.secrets for v in headers.values(multi=True)):
                flow.response = _refusal(
                    421,
                    b"a secret's placeholder sent anywhere but to its own hosts, over HTTPS, "
                    b"where the TLS name, the Host header and port 443 agree",
                )
                return
            flow.request.stream = True
            return
        for key in list(headers.keys()):
            values = headers.get_all(key)
            changed = []
            for text in values:
                for secret in mine:
                    text = text.replace(secret.placeholder, secret.value)
                changed.append(text)
            if changed != values:
                headers.set_all(key, changed)
        # an answer in plain bytes, where a repeated value can be found and put back (and no
        # compressed transfer coding either: `TE: gzip`)
        headers["accept-encoding"] = "identity"
        if "te" in headers:
            headers["te"] = "trailers"
        flow.request.stream = True

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None:
            return
        if response.status_code == 101:  # what follows an upgrade is no longer HTTP to scrub
            flow.kill()
            return
        coding = response.headers.get("transfer-encoding", "chunked").replace(" ", "").lower()
        named = [response.reason, *response.headers.keys()]
        if coding != "chunked" or any(s.value in text for s in self.secrets for text in named):
            flow.kill()  # a compressed transfer, or a value where nothing is put back: cut
            return
        for key in list(response.headers.keys()):
            values = response.headers.get_all(key)
            changed = [_put_back(v, self.secrets) for v in values]
            if changed != values:
                response.headers.set_all(key, changed)
        if response.headers.get("content-encoding", "identity").lower() in ("", "identity"):
            response.stream = Scrub(self.secrets)
            return
        # Compressed (though asked for plain bytes): held whole, decoded and put back in
        # `response`, when it says it is small; else cut, as a value in it would pass unseen.
        length = response.headers.get("content-length", "")
        if response.stream or not length.isdigit() or int(length) > HELD_LIMIT:
            flow.kill()

    def response(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is None:
            return
        if response.trailers:
            for key in list(response.trailers.keys()):
                values = response.trailers.get_all(key)
                response.trailers.set_all(key, [_put_back(v, self.secrets) for v in values])
        if response.stream:
            return
        try:  # an encoding this cannot undo would carry a value unseen: refused
            body = response.get_content(strict=True)
        except ValueError:
            flow.response = _refusal(502, b"an answer in an encoding the gateway cannot read")
            return
        if body is None:
            return
        for secret in self.secrets:
            body = body.replace(secret.value_bytes, secret.placeholder_bytes)
        response.set_content(body)


def _refusal(status: int, why: bytes) -> http.Response:
    return http.Response.make(
        status,
        b"orchestrator egress gateway: the secrets relay refuses " + why + b"\n",
        {"content-type": "text/plain"},
    )


def _put_back(text: str, secrets: list[Secret]) -> str:
    for secret in secrets:
        text = text.replace(secret.value, secret.placeholder)
    return text


addons = [Relay()]
