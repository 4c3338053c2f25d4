"""The SSRF-safe HTTP client that sends to URLs users register: where a URL may point, resolving
it once, connections pinned to the checked addresses, and the sender with its watchdog and
keep-alive reuse. Named for the direction of the traffic rather than for webhooks: it knows
nothing of events or deliveries, only that the destination is someone else's and untrusted.

Destinations are checked at each send: the host is resolved once, every address it resolves to
must be public (unless `webhooks.allow_private_networks`), and the connection goes to the
checked address, with the host name kept for TLS (SNI, certificate) and `Host`. The services an
operator names in the configuration (connectors.meta_graph_url, connectors.indiamart_url) are
the operator's choice, like the database's address: their sender takes `operator_settings`.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator
from urllib.parse import SplitResult, urlsplit

KEPT_RESPONSE = 1024               # bytes of a receiver's answer kept (a delivery's last_response)
DRAINED_RESPONSE = 64 * 1024       # an answer longer than this is not read to the end: the connection closes
ADDRESSES_TRIED = 2                # of those a host resolves to, within the attempt's time


def operator_settings(timeout: float) -> dict[str, Any]:
    """A Sender's settings for URLs the operator configured rather than users registered: any
    http(s) host, a proxy or a private mirror included; still one timeout for the whole request."""
    return {"allow_http": True, "allow_private_networks": True, "timeout": timeout}


class Refused(Exception):
    """A destination the settings do not allow; the message says why."""


# --- where a webhook may point ------------------------------------------------------------------

def check_url(url: str, settings: dict[str, Any]) -> SplitResult:
    """The URL's parts if its form is acceptable (https, unless allow_http; a host; no credentials)."""
    try:
        parts = urlsplit(url)
        port = parts.port   # raises ValueError on a port that is not a number in 0-65535
    except ValueError:
        raise Refused("Not a valid URL.") from None
    if port == 0:   # no destination has it (and `parts.port or 443` would quietly send to 443)
        raise Refused("Not a valid URL: the port must be 1 to 65535.")
    schemes = ("https", "http") if settings["allow_http"] else ("https",)
    if parts.scheme not in schemes:
        raise Refused("Use an https:// URL." if not settings["allow_http"] else "Use an http:// or https:// URL.")
    if not parts.hostname:
        raise Refused("The URL needs a host.")
    if parts.username is not None or parts.password is not None:
        raise Refused("Leave credentials out of the URL: deliveries are signed instead.")
    if parts.fragment:
        raise Refused("A webhook URL has no #fragment.")
    return parts


# IPv6 ranges whose last 32 bits are an IPv4 address that a NAT64 translator (or, for the
# deprecated IPv4-compatible form, a tunnel) delivers to; 6to4 (2002::/16) is ipaddress's sixtofour.
CARRYING_IPV4 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("::/96"))
# IPv6 ranges that ipaddress counts as global but that lead into a local network: local-use NAT64
# (its translator is the operator's own), SIIT's IPv4-translated addresses, and the deprecated
# site-local range, which some stacks still route inside the site.
NEVER_PUBLIC = (ipaddress.IPv6Network("64:ff9b:1::/48"), ipaddress.IPv6Network("::ffff:0:0:0/96"),
                ipaddress.IPv6Network("fec0::/10"))


def is_public(address: str) -> bool:
    """Whether deliveries may go to this address: global and not multicast, and so is the IPv4
    address an IPv6 one carries (IPv4-mapped, NAT64, 6to4, IPv4-compatible), where it would arrive."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    checked = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if any(ip in network for network in NEVER_PUBLIC):
            return False
        if ip.ipv4_mapped:
            checked = [ip.ipv4_mapped]
        elif ip.sixtofour:
            checked.append(ip.sixtofour)
        elif any(ip in network for network in CARRYING_IPV4):
            checked.append(ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF))
    return all(each.is_global and not each.is_multicast for each in checked)


def resolve(parts: SplitResult, settings: dict[str, Any]) -> list[str]:
    """The addresses to connect to, each checked: all that the host resolves to, in order."""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        found = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        # Neither the resolver's words nor any address: how this server resolves names is its own.
        raise Refused(f"{parts.hostname} does not resolve.") from None
    addresses = list(dict.fromkeys(info[4][0] for info in found))
    if not settings["allow_private_networks"] and not all(is_public(a) for a in addresses):
        raise Refused(f"{parts.hostname} is not allowed: deliveries go to public addresses only, never loopback, "
                      "private, link-local or multicast ones (webhooks.allow_private_networks).")
    return addresses


def check_destination(url: str, settings: dict[str, Any]) -> None:
    """Refused unless deliveries may go to this URL now (form and resolved addresses)."""
    resolve(check_url(url, settings), settings)


# --- sending ---------------------------------------------------------------------------------

def connect_to(addresses: tuple[str, ...], port: int, deadline: float) -> socket.socket:
    """A TCP connection to the first of the checked addresses that answers (never a new lookup),
    made before the attempt's deadline."""
    error: OSError = ConnectionRefusedError("no address")
    for address in addresses[:ADDRESSES_TRIED]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no time left to connect")
        try:
            sock = socket.create_connection((address, port), left)
        except OSError as exc:
            error = exc
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise error


class PinnedHTTPConnection(http.client.HTTPConnection):
    """An HTTP connection to checked addresses; `Host` still names the URL's host."""

    def __init__(self, host: str, port: int, addresses: tuple[str, ...], timeout: float):
        super().__init__(host, port, timeout=timeout)
        self.addresses = addresses
        self.deadline = 0.0   # the attempt's, set by each attempt that uses the connection

    def connect(self) -> None:
        self.sock = connect_to(self.addresses, self.port, self.deadline)
        self.sock.settimeout(self.timeout)


class PinnedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection to checked addresses, verifying the certificate of the URL's host (SNI)."""

    def __init__(self, host: str, port: int, addresses: tuple[str, ...], timeout: float, tls: ssl.SSLContext):
        super().__init__(host, port, timeout=timeout, context=tls)
        self.addresses, self.tls = addresses, tls
        self.deadline = 0.0

    def connect(self) -> None:
        # The plain socket is the connection's while the handshake runs, so the watchdog can cut
        # a handshake that a receiver drags out.
        self.sock = connect_to(self.addresses, self.port, self.deadline)
        self.sock.settimeout(self.timeout)
        self.sock = self.tls.wrap_socket(self.sock, server_hostname=self.host)


@dataclass
class Answer:
    """What one attempt got: a status and the start of the body, or an error."""

    status: int | None = None
    body: str | None = None
    retry_after: float | None = None
    error: str | None = None
    duration_ms: int = 0
    whole: bool = False   # the body is all of the answer's (read to its end, within what was kept)


class Attempt:
    """One send: the connection it uses, and whether the watchdog cut it off."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.fired = False
        self.connection: http.client.HTTPConnection | None = None

    def watch(self, connection: http.client.HTTPConnection) -> http.client.HTTPConnection:
        self.connection = connection
        connection.deadline = self.deadline
        return connection

    def cut(self) -> None:
        self.fired = True
        sock = self.connection.sock if self.connection is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)   # the blocked read returns at once
            except OSError:
                pass


class Watchdog:
    """Cuts the connection of an attempt whose time is up. A socket's timeout bounds each read,
    not the answer: a receiver that sends its head a byte at a time would otherwise hold the
    attempt, and its sender thread, as long as it liked. One thread watches a sender's attempts
    while there are any (a timer per attempt would start a thread for every send)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.tick = min(1.0, seconds / 4)   # an attempt is cut at most a tick late
        self.attempts: set[Attempt] = set()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    @contextlib.contextmanager
    def attempt(self) -> Iterator[Attempt]:
        attempt = Attempt(time.monotonic() + self.seconds)
        with self.lock:
            self.attempts.add(attempt)
            if self.thread is None:
                self.thread = threading.Thread(target=self._watch, name="leadsvc-webhook-watchdog", daemon=True)
                self.thread.start()
        try:
            yield attempt
        finally:
            with self.lock:
                self.attempts.discard(attempt)

    def _watch(self) -> None:
        while True:
            time.sleep(self.tick)
            now = time.monotonic()
            with self.lock:
                if not self.attempts:
                    self.thread = None
                    return
                for attempt in self.attempts:   # under the lock: an attempt that has ended is never cut
                    if attempt.deadline <= now and not attempt.fired:
                        attempt.cut()


class Sender:
    """Requests over keep-alive connections, each pinned to the address checked for that send."""

    def __init__(self, settings: dict[str, Any]):
        self.settings = settings
        self.tls = ssl.create_default_context()
        self.idle: dict[tuple, list[http.client.HTTPConnection]] = {}
        self.lock = threading.Lock()
        # webhooks.timeout is the whole attempt's: connect, request, answer, together.
        self.watchdog = Watchdog(settings["timeout"])

    def post(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        return self.send("POST", url, body, headers)

    def get(self, url: str, headers: dict[str, str], *, keep: int) -> Answer:
        """A GET whose answer is read up to `keep` bytes (a longer one is not `whole`)."""
        return self.send("GET", url, None, headers, keep=keep)

    def send(self, method: str, url: str, body: bytes | None, headers: dict[str, str], *,
             keep: int = KEPT_RESPONSE) -> Answer:
        started = time.perf_counter()
        answer = self._send(method, url, body, headers, keep)
        answer.duration_ms = round((time.perf_counter() - started) * 1000)
        # The receiver's bytes (its body, or a status line quoted in an error) are kept as text,
        # which PostgreSQL refuses with a NUL in it.
        answer.body, answer.error = (None if text is None else text.replace("\x00", "\ufffd")
                                     for text in (answer.body, answer.error))
        return answer

    def _send(self, method: str, url: str, body: bytes | None, headers: dict[str, str], keep: int) -> Answer:
        try:
            parts = check_url(url, self.settings)
            addresses = tuple(resolve(parts, self.settings))
        except Refused as exc:
            return Answer(error=str(exc))
        port = parts.port or (443 if parts.scheme == "https" else 80)
        key = (parts.scheme, parts.hostname, port, addresses)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        with self.watchdog.attempt() as attempt:
            answer = self._attempt(key, (method, target, body, headers, keep), attempt)
        if attempt.fired:   # whatever http.client made of an answer cut short, it is no success
            return Answer(error=f"No complete answer within {self.watchdog.seconds:g} s.")
        return answer

    def _attempt(self, key: tuple, request: tuple, attempt: Attempt) -> Answer:
        reused = self._take(key)
        connection = attempt.watch(reused or self._connect(key))
        try:
            try:
                return self._exchange(key, connection, request, attempt)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if reused is None or attempt.fired:
                    raise
                # The receiver closed the idle connection meanwhile: once more on a new one.
                connection.close()
                connection = attempt.watch(self._connect(key))
                return self._exchange(key, connection, request, attempt)
        except TimeoutError:
            connection.close()
            return Answer(error=f"No answer within {self.settings['timeout']} s.")
        except ssl.SSLError as exc:
            connection.close()
            return Answer(error=f"TLS failed: {exc.reason or exc}.")
        except ConnectionRefusedError:
            connection.close()
            return Answer(error="Connection refused.")
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            return Answer(error=f"{type(exc).__name__}: {exc}"[:500])

    def _exchange(self, key: tuple, connection: http.client.HTTPConnection, request: tuple,
                  attempt: Attempt) -> Answer:
        method, target, body, headers, keep = request
        connection.request(method, target, body=body, headers=headers)
        response = connection.getresponse()
        kept, read = bytearray(), 0
        drained = max(keep, DRAINED_RESPONSE)
        while read <= drained and time.monotonic() < attempt.deadline and (chunk := response.read1(16384)):
            kept += chunk[:keep - len(kept)]
            read += len(chunk)
        if response.isclosed() and (response.getheader("Connection") or "").lower() != "close" and not attempt.fired:
            self._give_back(key, connection)
        else:
            connection.close()
        return Answer(status=response.status, body=kept.decode("utf-8", "replace"),
                      retry_after=retry_after(response.getheader("Retry-After")),
                      whole=response.isclosed() and read <= keep)

    def _connect(self, key: tuple) -> PinnedHTTPConnection | PinnedHTTPSConnection:
        scheme, host, port, addresses = key
        timeout = self.settings["timeout"]
        if scheme == "https":
            return PinnedHTTPSConnection(host, port, addresses, timeout, self.tls)
        return PinnedHTTPConnection(host, port, addresses, timeout)

    def _take(self, key: tuple) -> http.client.HTTPConnection | None:
        with self.lock:
            idle = self.idle.get(key)
            return idle.pop() if idle else None

    def _give_back(self, key: tuple, connection: http.client.HTTPConnection) -> None:
        with self.lock:
            self.idle.setdefault(key, []).append(connection)

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():   # str.isdigit() alone also takes "\u00b2", which float() refuses
        return float(value)
    try:
        from email.utils import parsedate_to_datetime

        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None
