"""Edge hosts: a host whose embedded NATS is a leaf node of the hub keeps taking writes
while the link is cut, and both sides converge when it returns (``eventlog.leaf``).
Real servers on loopback; the link is cut by disabling the leaf's remote (SIGHUP)."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from eventlog import EmbeddedNats, JetStreamLog
from eventlog.codec import HDR_MSG_ID
from eventlog.embedded import NatsCredentials
from eventlog.keys import DESTROYED, key_name
from eventlog.leaf import LeafLog, out_name
from ops.cli import observing
from ops.cluster import free_ports
from ops.connect import first_stream
from projections.queries import Experience
from sync import PulseDB
from tests.harness import PULSE, clean_env, eventually, hub_server, start, stop

pytestmark = pytest.mark.timeout(60)


@dataclass
class Edge:
    hub_server: EmbeddedNats
    hub: PulseDB
    leaf: PulseDB
    leaf_url: str

    @property
    def leaf_server(self) -> EmbeddedNats:
        assert self.leaf.server is not None
        return self.leaf.server

    @property
    def leaf_log(self) -> LeafLog:
        assert isinstance(self.leaf.log, LeafLog)
        return self.leaf.log


@pytest.fixture
async def edge(tmp_path: Path) -> AsyncIterator[Edge]:
    server, leaf_url = hub_server(tmp_path)
    hub = leaf = None
    try:
        hub = await PulseDB.open(tmp_path / "hub", server.url)
        leaf = await PulseDB.open(tmp_path / "leaf", leaf_of=leaf_url)
        yield Edge(server, hub, leaf, leaf_url)
    finally:
        for db in (leaf, hub):
            if db is not None:
                await db.close()
        server.stop()


async def msg_ids(db: PulseDB, stream: str) -> Counter[str]:
    """How many times each ``Nats-Msg-Id`` is in ``stream`` (read raw, message by message)."""
    admin = first_stream(db.log).admin
    info = await admin.stream_info(stream)
    found: Counter[str] = Counter()
    seq = int(info.state.first_seq)
    while seq and seq <= int(info.state.last_seq):
        try:
            msg = await admin.get_msg(stream, seq)
        except Exception:  # a purged gap
            seq += 1
            continue
        found[(msg.headers or {}).get(HDR_MSG_ID, "")] += 1
        seq += 1
    return found


async def got(db: PulseDB, experience_id: UUID) -> Experience:
    found = await db.get_experience(experience_id)
    assert found is not None, f"experience {experience_id} missing"
    return found


async def converged(a: PulseDB, b: PulseDB, timeout: float = 20.0) -> float:
    started = time.monotonic()

    async def equal() -> bool:
        await a.sync(timeout=5)
        await b.sync(timeout=5)
        return await a.digest() == await b.digest()

    await eventually(equal, timeout=timeout, interval=0.05, what="equal digests")
    return time.monotonic() - started


async def link_is(edge: Edge, state: str) -> bool:
    return (await edge.leaf.status()).leaf.link == state  # type: ignore[union-attr]


async def test_a_leaf_host_writes_while_cut_off_and_converges_exactly(edge: Edge) -> None:
    hub, leaf = edge.hub, edge.leaf
    await eventually(lambda: link_is(edge, "up"), what="link up", timeout=10)
    cid = await hub.create_collective("owner", "team", 2)
    await converged(hub, leaf)
    shared = await hub.record_experience(cid, "from the hub", [1, 0])
    mine = await leaf.record_experience(cid, "from the edge", [0, 1])
    await converged(hub, leaf)
    assert (await got(leaf, shared)).content == "from the hub"
    assert (await got(hub, mine)).content == "from the edge"
    reinforced = Counter({shared: 0, mine: 0})
    for eid in (shared, mine):
        await hub.reinforce_experience(eid)
        await leaf.reinforce_experience(eid)
        reinforced[eid] += 2

    edge.leaf_server.set_leaf_link(False)  # cut
    await eventually(lambda: link_is(edge, "down"), what="link down", timeout=10)
    written = []
    for i in range(5):
        written.append(await leaf.record_experience(cid, f"edge offline {i}", [0.5, 0.5]))
        written.append(await hub.record_experience(cid, f"hub meanwhile {i}", [0.5, 0.5]))
    for eid in (shared, mine):
        for _ in range(3):
            await leaf.reinforce_experience(eid)  # acknowledged offline: read-your-writes
            await hub.reinforce_experience(eid)
            reinforced[eid] += 2
    assert (await got(leaf, written[0])).content == "edge offline 0"
    await leaf.update_experience(shared, importance=0.9)
    await hub.update_experience(mine, confidence=0.8)
    await leaf.invalidate_experience(mine, "superseded at the edge")
    status = (await leaf.status()).leaf
    assert status is not None and status.link == "down" and status.hub is None
    assert status.outbound_backlog > 0 and not status.backlog_exact
    assert await hub.digest() != await leaf.digest()
    assert await hub.get_experience(written[0]) is None  # not there yet

    edge.leaf_server.set_leaf_link(True)  # restore
    healed = await converged(hub, leaf)
    print(f"\nheal: digests equal {healed:.2f}s after the link was restored")
    for eid in (shared, mine):
        for db in (hub, leaf):
            assert (await got(db, eid)).applications == reinforced[eid]
    for eid in written:
        assert (await got(hub, eid)).experience_id == (await got(leaf, eid)).experience_id
    assert (await got(hub, shared)).importance == 0.9
    assert (await got(leaf, mine)).confidence == 0.8
    assert (await got(hub, mine)).invalid_reason == "superseded at the edge"

    # every event once in each stream: the hub's PULSE, the leaf's PULSE (the cut was
    # far shorter than its duplicate window) and the leaf's outbox
    await eventually(
        lambda: link_is(edge, "up"), what="link up again", timeout=10
    )  # (status reads the hub's view)
    hub_ids = await msg_ids(hub, "PULSE")
    leaf_ids = await msg_ids(leaf, "PULSE")
    assert max(hub_ids.values()) == 1 and max(leaf_ids.values()) == 1
    assert hub_ids.keys() == leaf_ids.keys()
    outbox = await msg_ids(leaf, out_name(edge.leaf_log.settings))
    assert outbox.keys() <= hub_ids.keys()
    status = (await leaf.status()).leaf
    assert status is not None and status.link == "up" and status.backlog_exact
    assert status.outbound_backlog == 0 and status.hub == "pulse-embedded"


async def test_a_leaf_status_and_idempotent_retries(edge: Edge) -> None:
    leaf = edge.leaf
    await eventually(lambda: link_is(edge, "up"), what="link up", timeout=10)
    cid = await leaf.create_collective("owner", "edge team", 2)
    first = await leaf.record_experience(cid, "once", [1, 0], idempotency_key="k-1")
    again = await leaf.record_experience(cid, "once", [1, 0], idempotency_key="k-1")
    assert first == again
    await converged(edge.hub, leaf)
    status = await leaf.status()
    assert status.leaf is not None and status.leaf.domain == edge.leaf_server.domain
    assert status.leaf.hub_domain == "hub" and status.leaf.rtt
    info = json.loads(
        (await edge.leaf_log.nc.request("$JS.hub.API.STREAM.INFO.PULSE", b"", 2)).data
    )
    assert any(
        (s.get("external") or {}).get("api") == f"$JS.{edge.leaf_server.domain}.API"
        for s in info["sources"]
    )


async def test_leaf_options_are_checked(tmp_path: Path) -> None:
    from eventlog import ValidationError

    with pytest.raises(ValidationError, match="leaf_of"):
        EmbeddedNats(tmp_path, leaf_of="http://hub:7422")
    with pytest.raises(ValidationError, match="leaf_of"):
        await PulseDB.open(tmp_path, "nats://127.0.0.1:4222", leaf_of="nats-leaf://h:7422")
    with pytest.raises(ValidationError, match="domain"):
        EmbeddedNats(tmp_path, leaf_of="nats-leaf://h:7422", domain="a.b")
    assert asyncio.get_running_loop()


async def test_a_data_directory_that_is_not_an_edge_hosts_is_not_made_one(
    tmp_path: Path, edge: Edge
) -> None:
    from eventlog import ValidationError

    plain = await PulseDB.open(tmp_path / "plain")  # its own embedded server and store
    await plain.close()
    with pytest.raises(ValidationError, match="leaf_of: .* is not an edge host"):
        await PulseDB.open(tmp_path / "plain", leaf_of="nats-leaf://leaf:pw@127.0.0.1:1")
    again = await PulseDB.open(tmp_path / "plain")  # and it still opens as it was
    await again.close()
    with pytest.raises(ValidationError, match="collectives: an edge host follows every"):
        await PulseDB.attach(tmp_path / "other", edge.leaf_log, collectives=["x"], owns_log=False)
    backup = subprocess.run(
        [PULSE, "--data-dir", str(edge.leaf.data_dir), "backup", str(tmp_path / "b.tar")],
        capture_output=True, text=True, timeout=60, env=clean_env(),
    )  # fmt: skip
    assert backup.returncode == 1 and "an edge host's" in backup.stderr, backup.stderr


async def test_pulse_up_as_a_hub_and_as_an_edge_host(tmp_path: Path) -> None:
    """`pulse up --leaf-listen` (a hub) and `pulse up --leaf-of` (an edge host): banners,
    and `pulse status` on the edge host showing the link."""
    (port,) = free_ports(1)
    hub = start(tmp_path / "hub", "--leaf-listen", str(port))
    edge = None
    try:
        assert f"--leaf-of nats-leaf://leaf:***@127.0.0.1:{port}" in hub.banner
        creds = NatsCredentials.load(tmp_path / "hub" / "nats" / "leaf-credentials.json")
        url = creds.in_url(f"nats-leaf://127.0.0.1:{port}")
        edge = start(tmp_path / "edge", "--leaf-of", url)
        assert f"a leaf node of nats-leaf://leaf:***@127.0.0.1:{port}" in edge.banner
        assert creds.password not in edge.banner
        shown: list[str] = []

        async def linked() -> bool:
            status = await asyncio.to_thread(
                subprocess.run,
                [PULSE, "--data-dir", str(tmp_path / "edge"), "status"],
                capture_output=True, text=True, env=clean_env(), timeout=30,
            )  # fmt: skip
            assert status.returncode == 0, status.stderr
            shown[:] = [x for x in status.stdout.splitlines() if x.startswith("leaf ")]
            return "link UP to pulse-embedded (domain hub" in shown[0]

        await eventually(linked, timeout=15, interval=0.1, what="the edge host's link up")
        assert "0 events not at the hub yet" in shown[0]
    finally:
        if edge is not None:
            stop(edge)
        stop(hub)


async def test_a_delete_on_a_leaf_forgets_on_both_sides(edge: Edge) -> None:
    from eventlog import LogUnavailable

    hub, leaf = edge.hub, edge.leaf
    await eventually(lambda: link_is(edge, "up"), what="link up", timeout=10)
    cid = await leaf.create_collective("owner", "edge team", 2)
    gone = await leaf.record_experience(cid, "forget me", [1, 0])
    await hub.sync()
    await converged(hub, leaf)
    await leaf.delete_experience(gone)  # link up: the hub's copy is purged too
    await converged(hub, leaf)
    for db in (hub, leaf):
        assert await db.get_experience(gone) is None
    subject = f"pulse.c.{cid}.experience.{gone}"
    for db, stream in ((hub, "PULSE"), (leaf, "PULSE"), (leaf, "PULSE_OUT")):
        left = await db.log.admin.stream_info(stream, subjects_filter=subject)  # type: ignore[attr-defined]
        assert (left.state.subjects or {}).get(subject) == 1, stream  # the tombstone alone

    later = await leaf.record_experience(cid, "forget me offline", [0, 1])
    await converged(hub, leaf)
    edge.leaf_server.set_leaf_link(False)
    await eventually(lambda: link_is(edge, "down"), what="link down", timeout=10)
    edge.leaf_log.append_timeout = 1.0
    with pytest.raises(LogUnavailable, match="hub"):  # forgotten here, owed at the hub
        await leaf.delete_experience(later)
    assert await leaf.get_experience(later) is None
    assert leaf.owed.pending()
    edge.leaf_server.set_leaf_link(True)
    await converged(hub, leaf)
    subject = f"pulse.c.{cid}.experience.{later}"

    async def hub_forgot() -> bool:  # the link's return finishes what the delete owes
        left = await hub.log.admin.stream_info("PULSE", subjects_filter=subject)  # type: ignore[attr-defined]
        return (left.state.subjects or {}).get(subject) == 1 and not leaf.owed.pending()

    await eventually(hub_forgot, what="the hub's copy forgotten", timeout=15)

    # deleted elsewhere: the hub purged its stream, and the leaf forgets its own copies
    theirs = await leaf.record_experience(cid, "the hub forgets this", [1, 1])
    await converged(hub, leaf)
    await hub.delete_experience(theirs)
    await converged(hub, leaf)
    subject = f"pulse.c.{cid}.experience.{theirs}"

    async def copies_forgotten() -> bool:
        held = {}
        for stream in ("PULSE", "PULSE_OUT"):
            info = await leaf.log.admin.stream_info(stream, subjects_filter=subject)  # type: ignore[attr-defined]
            held[stream] = (info.state.subjects or {}).get(subject, 0)
        return held == {"PULSE": 1, "PULSE_OUT": 0}  # the tombstone alone

    await eventually(copies_forgotten, what="the leaf's copies forgotten", timeout=10)


async def test_an_edge_host_forgets_what_was_deleted_while_it_was_away(edge: Edge) -> None:
    hub = edge.hub
    cid = await hub.create_collective("owner", "away", 2)
    theirs = await hub.record_experience(cid, "deleted while the edge host is away", [1, 0])
    subject = f"pulse.c.{cid}.experience.{theirs}"

    async def held(log: LeafLog) -> int:
        info = await log.admin.stream_info("PULSE", subjects_filter=subject)
        return int((info.state.subjects or {}).get(subject, 0))

    await eventually(lambda: held(edge.leaf_log), what="the experience at the edge", timeout=20)
    data_dir = edge.leaf.data_dir
    await edge.leaf.close()
    await hub.delete_experience(theirs)
    # its server alone (no instance) takes the tombstone in: the next open's catch-up
    # applies it, before any listener of the tail could hear of it
    server = EmbeddedNats(data_dir, leaf_of=edge.leaf_url)
    server.start()
    log = await LeafLog.open_leaf(server)
    try:
        await eventually(lambda: _at_least(held(log), 2), what="the tombstone sourced", timeout=20)
    finally:
        await log.close()
        server.stop()
    edge.leaf = await PulseDB.open(data_dir)
    assert await edge.leaf.get_experience(theirs) is None
    assert await held(edge.leaf_log) == 1  # the tombstone alone, as soon as it opened


async def _at_least(count: Awaitable[int], least: int) -> bool:
    return await count >= least


async def test_two_edge_hosts_resuming_at_once_both_stay_sources_of_the_hub(
    tmp_path: Path,
) -> None:
    """Each rewrites the hub stream's sources (read, change, write) when its link comes
    back: done at once, neither may undo the other's (as after a hub restart)."""
    server, leaf_url = hub_server(tmp_path)
    hosts: list[PulseDB] = []
    try:
        hub = await PulseDB.open(tmp_path / "hub", server.url)
        hosts = [hub] + [
            await PulseDB.open(tmp_path / name, leaf_of=leaf_url) for name in ("a", "b")
        ]
        edges = [h.log for h in hosts[1:]]
        assert all(isinstance(e, LeafLog) for e in edges)

        async def sources() -> int:
            info = await hub.log.admin.stream_info("PULSE")  # type: ignore[attr-defined]
            return len(info.config.sources or [])

        await eventually(lambda: _at_least(sources(), 2), what="both registered", timeout=20)
        for _ in range(15):
            await asyncio.gather(*(e._readd_sources() for e in edges))  # type: ignore[attr-defined]
            assert await sources() == 2
    finally:
        for db in reversed(hosts):
            await db.close()
        server.stop()


def _stores_holding(root: Path, needle: bytes) -> list[str]:
    return [
        str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()
    ]  # fmt: skip


async def test_data_keys_cross_the_link_and_are_erased_on_both_sides(
    edge: Edge, tmp_path: Path
) -> None:
    """A key an edge host makes offline reaches the hub with its event; deleting, on
    either side, erases the key's value from both sides' NATS stores."""
    hub, leaf = edge.hub, edge.leaf
    cid = await hub.create_collective("owner", "keys", 2)
    await eventually(lambda: _knows(leaf, cid), what="the collective at the edge", timeout=20)
    edge.leaf_server.set_leaf_link(False)
    offline = await leaf.record_experience(cid, "made while cut off", [1, 0])
    ours = key_name("experience", offline, cid)
    wrapped = await leaf.sealer.keyring.store.get(ours)
    assert isinstance(wrapped, bytes)
    edge.leaf_server.set_leaf_link(True)
    await eventually(lambda: _has(hub, offline), what="the offline record at the hub", timeout=30)
    assert (await hub.get_experience(offline)).content == "made while cut off"  # type: ignore[union-attr]
    hub_store, leaf_store = tmp_path / "hub-nats", tmp_path / "leaf"
    assert _stores_holding(hub_store, wrapped) and _stores_holding(leaf_store, wrapped)

    await leaf.delete_experience(offline)  # on the edge host: both sides erased

    async def marked() -> bool:  # (its marker reaches the hub by the source)
        return await hub.sealer.keyring.store.get(ours) is DESTROYED

    await eventually(marked, what="the key's marker at the hub", timeout=20)

    def gone_at_the_hub() -> bool:  # (the hub erases its copy once it reads the marker)
        return _stores_holding(hub_store, wrapped) == []

    await eventually(gone_at_the_hub, what="the key erased at the hub", timeout=20)

    def gone_here() -> bool:  # (the hub's echo of it may reach the edge's copy late: the
        return _stores_holding(leaf_store, wrapped) == []  # marker after it erases it)

    await eventually(gone_here, what="the key erased at the edge", timeout=20)

    theirs = await hub.record_experience(cid, "made at the hub", [0, 1])
    await eventually(lambda: _has(leaf, theirs), what="the hub's record at the edge", timeout=20)
    name = key_name("experience", theirs, cid)
    held = await hub.sealer.keyring.store.get(name)
    assert isinstance(held, bytes)
    await eventually(  # (its copy of the hub's bucket has it; reading it may come first)
        lambda: bool(_stores_holding(leaf_store, held)), what="the key in the edge's copy"
    )
    await hub.delete_experience(theirs)  # at the hub: the edge host erases its copy

    async def erased() -> bool:
        return _stores_holding(leaf_store, held) == [] and not await _has(leaf, theirs)

    await eventually(erased, what="the edge host's copy of the key erased", timeout=20)
    assert _stores_holding(hub_store, held) == []


async def _knows(db: PulseDB, cid: UUID) -> bool:
    return await db.get_collective(cid) is not None


async def _has(db: PulseDB, experience_id: UUID) -> bool:
    return await db.get_experience(experience_id) is not None


async def test_an_edge_host_forgets_its_copies_of_a_session_deleted_at_the_hub(
    edge: Edge, tmp_path: Path
) -> None:
    """An edge host keeps its own copy of the log and of the key bucket: a session deleted
    at the hub leaves both (the tombstone alone stays; the key's value is erased)."""
    hub, leaf = edge.hub, edge.leaf
    cid = await hub.create_collective("owner", "edge", 2)
    s = (await hub.start_session(cid, "agent", "held at the edge too")).session_id
    await hub.update_session(s, summary="replaced at the edge too")
    subject = f"pulse.c.{cid}.session.{s}"
    name = key_name("session", s, cid)
    wrapped = await hub.sealer.keyring.store.get(name)
    assert isinstance(wrapped, bytes)

    async def held(stream: str) -> int:
        info = await leaf.log.admin.stream_info(stream, subjects_filter=subject)  # type: ignore[attr-defined]
        return int((info.state.subjects or {}).get(subject, 0))

    async def at_the_edge() -> bool:
        found = await leaf.get_session(s)
        return found is not None and found.summary == "replaced at the edge too"

    await eventually(at_the_edge, what="the session at the edge", timeout=20)
    assert await held("PULSE") == 2  # its start and its update
    leaf_store = tmp_path / "leaf"
    await eventually(lambda: bool(_stores_holding(leaf_store, wrapped)), what="the key at the edge")

    await hub.delete_session(s)

    async def forgotten() -> bool:
        return (
            await leaf.get_session(s) is None
            and await held("PULSE") == 1  # the tombstone alone
            and _stores_holding(leaf_store, wrapped) == []
        )

    await eventually(forgotten, what="the edge host's copies forgotten", timeout=20)


# -- a hub in partitions (eventlog.partitions) -------------------------------------------


async def _subject_counts(js: Any, stream: str, subject: str) -> dict[str, int]:
    info = await js.stream_info(stream, subjects_filter=subject)
    return dict(info.state.subjects or {})


async def test_an_edge_host_of_a_hub_in_partitions_writes_to_each_partition_and_converges(
    tmp_path: Path,
) -> None:
    """The edge's events go, by the hub's sources, to the one partition stream that holds
    their collective; written offline, they arrive once when the link returns; a delete at
    the edge forgets in that partition too; reopened without --partitions, the edge's
    data directory remembers them."""
    from eventlog import StreamSettings
    from eventlog.partitions import Layout

    layout = Layout(3)
    server, leaf_url = hub_server(tmp_path)
    hub = leaf = None
    try:
        hub = await PulseDB.open(
            tmp_path / "hub", server.url, stream_settings=StreamSettings(partitions=3)
        )
        leaf = await PulseDB.open(
            tmp_path / "leaf", leaf_of=leaf_url, stream_settings=StreamSettings(partitions=3)
        )
        edge = Edge(server, hub, leaf, leaf_url)
        await eventually(lambda: link_is(edge, "up"), what="link up", timeout=15)
        teams: list[UUID] = []  # collectives in two partitions at least, made at both ends
        while len(teams) < 2 or len({layout.part_of_collective(t) for t in teams}) < 2:
            maker = hub if len(teams) % 2 else leaf
            teams.append(await maker.create_collective("owner", f"team {len(teams)}", 2))
        await converged(hub, leaf)
        mine = {t: await leaf.record_experience(t, f"edge {t}", [0, 1]) for t in teams}
        await converged(hub, leaf)
        for team, eid in mine.items():  # in its collective's partition, and there alone
            subject = f"pulse.c.{team}.*.experience.{eid}"
            held = {
                stream: sum(
                    (await _subject_counts(first_stream(hub.log).admin, stream, subject)).values()
                )  # type: ignore[attr-defined]
                for stream in (layout.stream(p) for p in layout.parts)
            }
            assert held == {
                s: int(s == layout.stream(layout.part_of_collective(team))) for s in held
            }, held
            assert (await got(hub, eid)).content == f"edge {team}"

        edge.leaf_server.set_leaf_link(False)
        await eventually(lambda: link_is(edge, "down"), what="link down", timeout=10)
        offline = [await leaf.record_experience(t, "edge offline", [1, 1]) for t in teams]
        for eid in mine.values():
            await leaf.reinforce_experience(eid)
            await hub.reinforce_experience(eid)
        edge.leaf_server.set_leaf_link(True)
        await converged(hub, leaf)
        for eid in [*offline, *mine.values()]:
            assert (await got(hub, eid)).applications == (await got(leaf, eid)).applications
        for stream in (layout.stream(p) for p in layout.parts):  # each event once a stream
            ids = await msg_ids(hub, stream)
            assert not ids or max(ids.values()) == 1, stream

        async def exact() -> bool:
            status = (await leaf.status()).leaf
            assert status is not None and status.problem is None
            return status.backlog_exact and status.outbound_backlog == 0

        await eventually(exact, what="no backlog, exactly", timeout=15)

        gone, team = offline[0], teams[0]
        await leaf.delete_experience(gone)  # the hub's partition forgets it too
        subject = f"pulse.c.{team}.*.experience.{gone}"
        part_stream = layout.stream(layout.part_of_collective(team))

        async def forgotten() -> bool:
            counts = await _subject_counts(first_stream(hub.log).admin, part_stream, subject)  # type: ignore[attr-defined]
            return list(counts.values()) == [1]  # the tombstone alone

        await eventually(forgotten, what="the hub's partition forgot", timeout=15)
        await converged(hub, leaf)
        assert await hub.get_experience(gone) is None

        data_dir = leaf.data_dir
        await leaf.close()
        leaf = await PulseDB.open(data_dir)  # (its PULSE_OUT remembers the partitions)
        edge.leaf = leaf
        later = await leaf.record_experience(teams[-1], "after reopening", [1, 0])
        await converged(hub, leaf)
        assert (await got(hub, later)).content == "after reopening"
    finally:
        for db in (leaf, hub):
            if db is not None:
                await db.close()
        server.stop()


async def test_an_edge_host_of_one_stream_says_why_it_does_not_join_a_hub_in_partitions(
    tmp_path: Path,
) -> None:
    from eventlog import StreamSettings, ValidationError

    server, leaf_url = hub_server(tmp_path)
    hub = leaf = None
    try:
        hub = await PulseDB.open(
            tmp_path / "hub", server.url, stream_settings=StreamSettings(partitions=2)
        )
        leaf = await PulseDB.open(tmp_path / "leaf", leaf_of=leaf_url)

        async def told() -> bool:
            status = (await leaf.status()).leaf  # type: ignore[union-attr]
            assert status is not None
            return status.problem is not None and "partitions" in status.problem

        await eventually(told, what="the edge host's problem in its status", timeout=15)
        _, shown = await observing.status(leaf, argparse.Namespace(json=False))
        assert "not sending to the hub: partitions: the hub's log is in partitions" in shown
        cid = await leaf.create_collective("owner", "kept at the edge", 2)
        assert await leaf.get_collective(cid) is not None
        assert await hub.get_collective(cid) is None  # (nothing of the wrong form went there)
        data_dir = leaf.data_dir
        await leaf.close()
        leaf = None
        with pytest.raises(ValidationError, match="partitions: this edge host's log was made"):
            await PulseDB.open(data_dir, stream_settings=StreamSettings(partitions=2))
    finally:
        for db in (leaf, hub):
            if db is not None:
                await db.close()
        server.stop()


async def test_raising_the_hubs_partitions_keeps_its_edge_hosts(tmp_path: Path) -> None:
    """A raise from 2 to 3 partitions while an edge host runs: the hub's sources of its
    outbox follow the buckets, the edge host sources the new partition, and a host of
    the hub rebuilt on 3 partitions agrees with it, collective by collective."""
    from eventlog import StreamSettings
    from eventlog.partitioned import PartitionedLog, raise_partitions
    from eventlog.partitions import Layout

    two, three = StreamSettings(partitions=2), StreamSettings(partitions=3)
    server, leaf_url = hub_server(tmp_path)
    hub = leaf = None
    try:
        hub = await PulseDB.open(tmp_path / "hub", server.url, stream_settings=two)
        leaf = await PulseDB.open(tmp_path / "leaf", leaf_of=leaf_url, stream_settings=two)
        edge = Edge(server, hub, leaf, leaf_url)
        await eventually(lambda: link_is(edge, "up"), what="link up", timeout=15)
        teams: list[UUID] = []  # until one moves to the third partition
        while not any(Layout(3).part_of_collective(t) == 3 for t in teams):
            teams.append(await leaf.create_collective("owner", f"team {len(teams)}", 2))
        moved = next(t for t in teams if Layout(3).part_of_collective(t) == 3)
        before = {t: await leaf.record_experience(t, "before the raise", [1, 0]) for t in teams}
        await converged(hub, leaf)
        await hub.close()
        hub = None
        log = await PartitionedLog.connect(server.url, two)
        try:
            done = await raise_partitions(log.parts[0], 3)
        finally:
            await log.close()
        assert done["edges"] == 1 and done["copied"] > 0
        hub = await PulseDB.open(tmp_path / "hub3", server.url, stream_settings=three)
        edge.hub = hub
        after = await leaf.record_experience(moved, "after the raise, at the edge", [0, 1])
        theirs = await hub.record_experience(moved, "after the raise, at the hub", [1, 1])
        await converged(hub, leaf, timeout=30)
        assert (await got(hub, after)).content == "after the raise, at the edge"
        assert (await got(leaf, theirs)).content == "after the raise, at the hub"
        for team, eid in before.items():
            assert (await got(hub, eid)).content == "before the raise"
            assert await hub.digest(team) == await leaf.digest(team)
        admin = first_stream(hub.log).admin
        subject = f"pulse.c.{moved}.>"
        for part in Layout(3).parts[1:]:  # the moved collective in its new partition alone
            held = sum((await _subject_counts(admin, Layout(3).stream(part), subject)).values())
            assert bool(held) == (part == 3), (part, held)
    finally:
        for db in (leaf, hub):
            if db is not None:
                await db.close()
        server.stop()


async def test_a_raise_from_one_stream_is_refused_while_edge_hosts_send_to_it(
    tmp_path: Path,
) -> None:
    from eventlog import ValidationError
    from eventlog.partitioned import raise_partitions

    server, leaf_url = hub_server(tmp_path)
    leaf = None
    try:
        leaf = await PulseDB.open(tmp_path / "leaf", leaf_of=leaf_url)
        log = await JetStreamLog.connect(server.url)
        try:

            async def registered() -> bool:
                info = await log.admin.stream_info("PULSE")
                return any(s.external is not None for s in info.config.sources or [])

            await eventually(registered, what="the edge host a source of the hub", timeout=15)
            with pytest.raises(ValidationError, match="1 edge host.s. send to the log PULSE"):
                await raise_partitions(log, 2)
            done = await raise_partitions(log, 2, drop_edges=True)
            assert done["edges"] == 1
            assert not await registered()

            async def told() -> bool:  # (the edge host, still running, sees the raise)
                assert leaf is not None
                status = (await leaf.status()).leaf
                return status is not None and "the hub's log is in partitions" in (
                    status.problem or ""
                )

            await eventually(told, what="the edge host's problem in its status", timeout=20)
            assert not await registered()  # (it does not add itself again)
        finally:
            await log.close()
    finally:
        if leaf is not None:
            await leaf.close()
        server.stop()
