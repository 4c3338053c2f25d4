"""Delivering events to webhooks: claim what is due, send each attempt signed, record its outcome.

A Deliverer runs in `leadsvc serve` (a background thread) and in `leadsvc worker`. It claims due
deliveries in one short transaction that moves their `next_attempt_at` to the end of a lease
and counts the attempt (PostgreSQL: `FOR UPDATE SKIP LOCKED`; SQLite: the write lock), so any
number of processes on one database never send the same attempt twice. The HTTP request runs
outside any transaction, on a small pool of sender threads with keep-alive connections, of which
one workspace and one destination hold at most a few at once (webhooks.per_workspace, per_host),
each for at most webhooks.timeout; each outcome is recorded in its own transaction, fenced by the
attempt number. A process that dies mid-attempt leaves the claim to lapse, and the delivery is
sent again (at least once).

Destinations are checked at each send: the host is resolved once, every address it resolves to
must be public (unless `webhooks.allow_private_networks`), and the connection goes to the
checked address, with the host name kept for TLS (SNI, certificate) and `Host`.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import ipaddress
import logging
import random
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Iterator
from urllib.parse import SplitResult, urlsplit

from . import events
from .db import NO_KEY_UPDATE, UNAVAILABLE_ERRORS, database, for_update, is_postgres, transaction
from .models import Delivery, Event, Webhook, utcnow

log = logging.getLogger("leadsvc.delivery")

# Seconds from each failed attempt to the next (DESIGN section 14); after the last, the delivery is dead.
SCHEDULE = (5, 5 * 60, 30 * 60, 2 * 3600, 5 * 3600, 10 * 3600, 10 * 3600, 24 * 3600, 24 * 3600)
JITTER = 0.2
MAX_RETRY_AFTER = 24 * 3600       # a Retry-After longer than the longest step is taken as that step
DISABLE_AFTER = timedelta(days=3)  # of failures only, with no success in between
KEPT_RESPONSE = 1024               # bytes of a receiver's answer kept in last_response
DRAINED_RESPONSE = 64 * 1024       # an answer longer than this is not read to the end: the connection closes
ADDRESSES_TRIED = 2                # of those a host resolves to, within the attempt's time
USER_AGENT = "leadsvc/{version}"
SENDERS = 8            # attempts a delivering process makes at once, each on its own thread and connection
# Due deliveries a claim reads per free sender to choose from: enough that workspaces and hosts at
# their cap, skipped, leave others to choose.
CANDIDATES_PER_SENDER = 8
# How often a delivering process looks for deliveries that other processes wrote (its own commits
# wake it at once).
POLL_SECONDS = 0.25


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
    except (socket.gaierror, UnicodeError) as exc:
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
    """POSTs over keep-alive connections, each pinned to the address checked for that send."""

    def __init__(self, settings: dict[str, Any]):
        self.settings = settings
        self.tls = ssl.create_default_context()
        self.idle: dict[tuple, list[http.client.HTTPConnection]] = {}
        self.lock = threading.Lock()
        # webhooks.timeout is the whole attempt's: connect, request, answer, together.
        self.watchdog = Watchdog(settings["timeout"])

    def post(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        started = time.perf_counter()
        answer = self._post(url, body, headers)
        answer.duration_ms = round((time.perf_counter() - started) * 1000)
        # The receiver's bytes (its body, or a status line quoted in an error) are kept as text,
        # which PostgreSQL refuses with a NUL in it.
        answer.body, answer.error = (None if text is None else text.replace("\x00", "\ufffd")
                                     for text in (answer.body, answer.error))
        return answer

    def _post(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        try:
            parts = check_url(url, self.settings)
            addresses = tuple(resolve(parts, self.settings))
        except Refused as exc:
            return Answer(error=str(exc))
        port = parts.port or (443 if parts.scheme == "https" else 80)
        key = (parts.scheme, parts.hostname, port, addresses)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        with self.watchdog.attempt() as attempt:
            answer = self._attempt(key, target, body, headers, attempt)
        if attempt.fired:   # whatever http.client made of an answer cut short, it is no success
            return Answer(error=f"No complete answer within {self.watchdog.seconds:g} s.")
        return answer

    def _attempt(self, key: tuple, target: str, body: bytes, headers: dict[str, str], attempt: Attempt) -> Answer:
        reused = self._take(key)
        connection = attempt.watch(reused or self._connect(key))
        try:
            try:
                return self._exchange(key, connection, target, body, headers, attempt)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if reused is None or attempt.fired:
                    raise
                # The receiver closed the idle connection meanwhile: once more on a new one.
                connection.close()
                connection = attempt.watch(self._connect(key))
                return self._exchange(key, connection, target, body, headers, attempt)
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

    def _exchange(self, key: tuple, connection: http.client.HTTPConnection, target: str, body: bytes,
                  headers: dict[str, str], attempt: Attempt) -> Answer:
        connection.request("POST", target, body=body, headers=headers)
        response = connection.getresponse()
        kept, read = b"", 0
        while read <= DRAINED_RESPONSE and time.monotonic() < attempt.deadline and (chunk := response.read1(16384)):
            kept += chunk[:KEPT_RESPONSE - len(kept)]
            read += len(chunk)
        if response.isclosed() and (response.getheader("Connection") or "").lower() != "close" and not attempt.fired:
            self._give_back(key, connection)
        else:
            connection.close()
        return Answer(status=response.status, body=kept.decode("utf-8", "replace"),
                      retry_after=retry_after(response.getheader("Retry-After")))

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


# --- the schedule ----------------------------------------------------------------------------

def next_delay(failures: int, answer: Answer, rng: Callable[[], float]) -> float | None:
    """Seconds until the attempt after this many failures (None: no more attempts)."""
    if failures > len(SCHEDULE):
        return None
    if answer.status in (429, 503) and answer.retry_after is not None:
        return min(answer.retry_after, MAX_RETRY_AFTER)
    return SCHEDULE[failures - 1] * (1 + JITTER * (2 * rng() - 1))


# --- the deliverer ---------------------------------------------------------------------------

@dataclass
class Claimed:
    """A delivery leased for one attempt: its attempt number and lease end fence what is recorded."""

    delivery: Delivery
    attempt: int
    lease_until: datetime
    holds: tuple = ()   # the workspace and destination whose sender slots the attempt counts against


def destination(url: str) -> tuple[str, ...]:
    """Where a webhook's attempts go, for the per-host cap: host and port (a URL that does not
    parse is its own destination; its attempt fails at once)."""
    try:
        parts = urlsplit(url)
        return ("host", (parts.hostname or "").lower(), str(parts.port or (443 if parts.scheme == "https" else 80)))
    except ValueError:
        return ("host", url)


class Deliverer:
    """Claims due deliveries and sends them on SENDERS threads until stopped."""

    def __init__(self, settings: dict[str, Any], *, version: str, metrics: Any = None,
                 clock: Callable[[], datetime] = utcnow, rng: Callable[[], float] = random.random):
        self.settings = settings["webhooks"]
        self.metrics = metrics
        self.clock, self.rng = clock, rng
        self.user_agent = USER_AGENT.format(version=version)
        self.sender = Sender(self.settings)
        self.senders = SENDERS
        # An attempt's claim outlasts anything it can take (its time, the watchdog's tick, the lookup).
        self.lease = timedelta(seconds=self.settings["timeout"] + 30)
        # Sender slots each workspace and each destination holds (attempts under way), and the
        # destinations of the webhooks claims have seen, so that a full destination's webhooks are
        # left out of the next claim's read.
        self.holding: collections.Counter = collections.Counter()
        self.destinations: dict[int, tuple] = {}
        self.poll = POLL_SECONDS
        self.stopping = threading.Event()
        self.slot_freed = threading.Event()
        self.in_flight = 0
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.pool: ThreadPoolExecutor | None = None

    # -- running in the background

    def start(self) -> "Deliverer":
        self.pool = ThreadPoolExecutor(self.senders, thread_name_prefix="leadsvc-send")
        self.thread = threading.Thread(target=self.run, name="leadsvc-delivery", daemon=True)
        self.thread.start()
        return self

    def stop(self, timeout: float = 30) -> None:
        """Stop claiming, and let the attempts under way finish."""
        self.stopping.set()
        self.slot_freed.set()
        events.work_waiting.set()
        if self.thread is not None:
            self.thread.join(timeout)
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        self.sender.close()

    def run(self) -> None:
        """Claim and hand out work until stopped: at once after a commit in this process wrote
        deliveries, else every poll interval (deliveries written by other processes)."""
        while not self.stopping.is_set():
            with self.lock:
                free = self.senders - self.in_flight
            if free <= 0:
                self.slot_freed.wait(self.poll)
                self.slot_freed.clear()
                continue
            events.work_waiting.clear()
            claimed = self._claim_safely(free)
            for item in claimed:
                with self.lock:
                    self.in_flight += 1
                    self.holding.update(item.holds)
                self.pool.submit(self._attempt_in_slot, item)
            if len(claimed) < free:
                events.work_waiting.wait(self.poll)

    def _attempt_in_slot(self, item: Claimed) -> None:
        try:
            self.attempt(item)
        except Exception:   # the claim lapses and the delivery is tried again; the thread lives on
            log.exception("delivery %s: recording the attempt failed", item.delivery.public_id)
        finally:
            release_connection()
            with self.lock:
                self.in_flight -= 1
                self.holding.subtract(item.holds)
                self.holding += collections.Counter()   # drops what no attempt holds any more
            self.slot_freed.set()

    def _claim_safely(self, limit: int) -> list[Claimed]:
        try:
            return self.claim(limit)
        except UNAVAILABLE_ERRORS as exc:
            log.warning("cannot claim deliveries: %s", exc)
        except Exception:   # the thread lives on: the next poll tries again
            log.exception("claiming deliveries failed")
        finally:
            release_connection()
        return []

    # -- one step at a time (also what tests drive, with their own clock)

    def deliver_due(self) -> int:
        """Send every delivery due now, in this thread; how many attempts were made."""
        made = 0
        while claimed := self.claim(self.senders):
            for item in claimed:
                self.attempt(item)
            made += len(claimed)
        return made

    def claim(self, limit: int) -> list[Claimed]:
        """Up to `limit` due deliveries, each leased to this process for one attempt: oldest first,
        but none of a workspace or destination that holds its share of the sender slots."""
        now = self.clock()
        lease_until = now + self.lease
        with self.lock:
            holding = collections.Counter(self.holding)
        per_workspace, per_host = self.settings["per_workspace"], self.settings["per_host"]
        full_workspaces = [key[1] for key, held in holding.items() if key[0] == "workspace" and held >= per_workspace]
        full_hooks = [hook for hook, where in self.destinations.items() if holding[where] >= per_host]
        due = (Delivery.select(Delivery.id, Webhook.id, Webhook.workspace, Webhook.url).join(Webhook)
               .where((Delivery.next_attempt_at <= now) & Webhook.workspace.not_in(full_workspaces)
                      & Webhook.id.not_in(full_hooks))
               .order_by(Delivery.next_attempt_at).limit(limit * CANDIDATES_PER_SENDER))
        if is_postgres():
            due = due.for_update(of=Delivery, skip_locked=True)
        with transaction():
            candidates = list(due.tuples())
            if len(self.destinations) > 100_000:   # webhooks come and go: forget, and learn again
                self.destinations.clear()
            self.destinations.update((hook, destination(url)) for _, hook, _, url in candidates)
            chosen = share_out(candidates, self.destinations, holding, limit, per_workspace, per_host)
            leased = list(Delivery.update(next_attempt_at=lease_until, attempts=Delivery.attempts + 1)
                          .where(Delivery.id.in_(list(chosen)) & (Delivery.next_attempt_at <= now))
                          .returning(Delivery.id, Delivery.attempts).tuples().execute()) if chosen else []
        if not leased:
            return []
        attempts = dict(leased)
        rows = (Delivery.select(Delivery, Event, Webhook).join(Event).switch(Delivery).join(Webhook)
                .where(Delivery.id.in_(list(attempts))))
        return [Claimed(row, attempts[row.id], lease_until, chosen[row.id]) for row in rows]

    def attempt(self, item: Claimed) -> None:
        """Send one attempt and record what came of it."""
        hook, event = item.delivery.webhook, item.delivery.event
        now = self.clock()
        try:
            signing = events.signing_secrets(hook, self.settings["secret_key"], now)
        except events.SecretKeyMissing as exc:
            answer = Answer(error=str(exc))
        else:
            headers = {**events.signed_headers(event.public_id, event.body, signing, now),
                       "Content-Type": "application/json", "User-Agent": self.user_agent}
            answer = self.sender.post(hook.url, event.body.encode(), headers)
        self.record(item, answer)

    def record(self, item: Claimed, answer: Answer) -> str | None:
        """The attempt's outcome, in its own transaction; None if the delivery moved on meanwhile
        (replayed, given up with its webhook, or deleted with it)."""
        now = self.clock()
        ok = answer.status is not None and 200 <= answer.status < 300
        disabled = None
        with transaction():
            # The webhook before its delivery, in the order every webhook write locks them (lock_webhook).
            hook = for_update(Webhook.select().where(Webhook.id == item.delivery.webhook_id), NO_KEY_UPDATE).first()
            delivery = None if hook is None else for_update(Delivery.select().where(
                (Delivery.id == item.delivery.id) & (Delivery.attempts == item.attempt)
                & (Delivery.next_attempt_at == item.lease_until))).first()
            if delivery is None:
                return None
            delivery.last_status, delivery.last_error = answer.status, answer.error
            # An erasure that cut the event while this attempt ran cleared the log: the answer
            # to the body sent before it may echo the person's data, so it is not kept.
            sent = item.delivery.event
            cut = answer.body and Event.select().where((Event.id == sent.id) & (Event.body != sent.body)).exists()
            delivery.last_response = None if cut else answer.body
            delivery.last_attempt_at, delivery.duration_ms = now, answer.duration_ms
            if not hook.active and not ok:   # disabled while this attempt ran: nothing more is scheduled
                delivery.state, delivery.next_attempt_at = "dead", None
            elif ok:
                delivery.state, delivery.next_attempt_at = "succeeded", None
                if hook.failing_since is not None:
                    Webhook.update(failing_since=None).where(Webhook.id == hook.id).execute()
            elif answer.status == 410:
                delivery.state, delivery.next_attempt_at = "dead", None
                disabled = disable(hook, "The endpoint answered 410 Gone.")
            else:
                delivery.failures += 1
                delay = next_delay(delivery.failures, answer, self.rng)
                if delay is None:
                    delivery.state, delivery.next_attempt_at = "dead", None
                else:
                    delivery.state, delivery.next_attempt_at = "failed", now + timedelta(seconds=delay)
                failing_since = hook.failing_since or now
                if hook.failing_since is None:
                    Webhook.update(failing_since=now).where(Webhook.id == hook.id).execute()
                if now - failing_since >= DISABLE_AFTER:
                    delivery.state, delivery.next_attempt_at = "dead", None
                    disabled = disable(hook, f"Every delivery failed for 3 days, since {failing_since:%Y-%m-%d %H:%M} "
                                             f"UTC (last: {describe(answer)}).")
            delivery.save()
        if not ok:
            warn_failed(item, answer, delivery.state, disabled)
        if self.metrics is not None:
            lag = (utcnow() - item.delivery.event.created_at).total_seconds() if ok else None
            self.metrics.delivery(delivery.state, lag)
        return delivery.state


def share_out(candidates: list[tuple], destinations: dict[int, tuple], holding: collections.Counter, limit: int,
              per_workspace: int, per_host: int) -> dict[int, tuple]:
    """The candidates (delivery, webhook, workspace, url; oldest first) to claim, each with the
    slots it holds: within each workspace's and destination's cap, and the workspaces with the
    fewest attempts under way first, so that a busy workspace's backlog does not come first."""
    counts = collections.Counter(holding)
    chosen: dict[int, tuple] = {}
    for level in range(per_workspace):
        for delivery_id, hook, workspace, _ in candidates:
            holds = (("workspace", workspace), destinations[hook])
            if (len(chosen) < limit and delivery_id not in chosen and counts[holds[0]] <= level
                    and counts[holds[0]] < per_workspace and counts[holds[1]] < per_host):
                chosen[delivery_id] = holds
                counts.update(holds)
    return chosen


def describe(answer: Answer) -> str:
    return f"HTTP {answer.status}" if answer.status is not None else (answer.error or "no answer")


def warn_failed(item: Claimed, answer: Answer, state: str, disabled: str | None) -> None:
    """A failed attempt in the log, so that an operator sees receivers refusing deliveries (a
    wrong secret, an endpoint gone): ids, the attempt and what came back, nothing about the lead."""
    hook, event = item.delivery.webhook.public_id, item.delivery.event.public_id
    log.warning("webhook %s: event %s, attempt %d failed: %s", hook, event, item.attempt, describe(answer))
    if disabled is not None:
        log.warning("webhook %s disabled: %s", hook, disabled)
    if state == "dead":
        log.warning("webhook %s: event %s given up after attempt %d", hook, event, item.attempt)


def disable(hook: Webhook, reason: str) -> str:
    """Turn a webhook off with a reason; its scheduled deliveries become dead (in the caller's
    transaction). The reason as kept."""
    reason = reason[:500]
    Webhook.update(active=False, disabled_reason=reason).where(Webhook.id == hook.id).execute()
    give_up(hook.id)
    return reason


def give_up(hook_id: int) -> None:
    """The webhook's scheduled deliveries become dead (it was disabled)."""
    Delivery.update(state="dead", next_attempt_at=None).where(
        (Delivery.webhook == hook_id) & Delivery.next_attempt_at.is_null(False)).execute()


def release_connection() -> None:
    """A delivery thread's PostgreSQL connection goes back to the pool between steps, so the
    delivery threads never hold connections the serving threads need. SQLite keeps its own."""
    if is_postgres() and not database.is_closed():
        database.close()
