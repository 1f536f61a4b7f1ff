"""Hosts that follow only some collectives, on a real NATS server: each one's state of a
collective equals a full host's (per-collective digests, history), requests about other
collectives are refused naming the host's scope, an owner reference follows collectives
created later, and a collective followed later is caught up alone, once."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from uuid import UUID

import pytest

from eventlog import EmbeddedNats
from eventlog.errors import NotFollowed, NotFoundError, ValidationError
from eventlog.ids import uuid7
from projections.projection import ProjectionSettings
from projections.scope import FILE
from sync import PulseDB
from sync.access import Principal
from tests.harness import PULSE, clean_env, eventually, start, stop

# the files are rewritten ``scrub_after`` seconds after a delete, and that rewrite cancels
# the SQL in its way (QueryCancelled: callers retry); these hosts compare their history in
# SQL at moments a loaded machine puts anywhere after their deletes, so theirs is put off
# past the test (forgetting is test_shredding's and test_session_forgetting's)
NO_REWRITE = ProjectionSettings(scrub_after=3600)


async def _history(db: PulseDB, cid: UUID) -> list[list[object]]:
    found = await db.sql(
        f"SELECT seq, event_type, entity_id FROM history WHERE collective_id = '{cid}' "
        "ORDER BY 1, 2, 3"
    )
    return found.rows


async def _same(full: PulseDB, host: PulseDB, cid: UUID) -> None:
    """The host's state and history of a collective are the full host's."""
    await asyncio.gather(full.sync(), host.sync())
    assert await host.digest(cid) == await full.digest(cid), f"collective {cid}"
    assert await _history(host, cid) == await _history(full, cid)


async def _busy(db: PulseDB, cid: UUID, tag: str, n: int = 4) -> list[UUID]:
    """Some of everything in a collective: experiences, reinforcements, a relation, an
    invalidation, an update and a delete."""
    made = [await db.record_experience(cid, f"{tag} fact {i}") for i in range(n)]
    for eid in made:
        await db.reinforce_experience(eid)
    await db.store_relation(made[1], made[0], "Supersedes", invalidate=True)
    await db.update_experience(made[2], importance=0.9)
    await db.delete_experience(made[3])
    return made


async def test_hosts_following_overlapping_sets_agree_with_a_full_host(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    full = await PulseDB.open(tmp_path / "full", nats_server.url, projection_settings=NO_REWRITE)
    hosts: list[PulseDB] = []
    try:
        alpha = await full.create_collective("acme", "alpha", embedder="hash")
        beta = await full.create_collective("acme", "beta", embedder="hash")
        gamma = await full.create_collective("zeta", "gamma", embedder="hash")
        await _busy(full, alpha, "early")
        sets = (["alpha"], [str(alpha), str(gamma)], ["owner:acme"])
        hosts = [
            await PulseDB.open(
                tmp_path / f"h{i}",
                nats_server.url,
                projection_settings=NO_REWRITE,
                collectives=refs,
            )
            for i, refs in enumerate(sets)
        ]
        assert [sorted(h.followed(), key=str) for h in hosts] == [
            [alpha],
            sorted([alpha, gamma], key=str),
            sorted([alpha, beta], key=str),
        ]
        # every host writes in what it follows, at the same time as the others
        await asyncio.gather(
            _busy(full, beta, "full"), _busy(hosts[0], alpha, "h0"),
            _busy(hosts[1], gamma, "h1"), _busy(hosts[2], beta, "h2"),
        )  # fmt: skip
        for host in hosts:
            for cid in host.followed():
                await _same(full, host, cid)

        # a collective it does not follow: refused, naming what it follows
        with pytest.raises(NotFollowed, match=r"not followed by this host \(it follows alpha\)"):
            await hosts[0].get_collective(gamma)
        # ... but to a principal that is no member of it, as one that never existed (that
        # it exists elsewhere would tell what it may not see)
        stranger, unknown = Principal("acme", "a1", "read"), uuid7()
        with hosts[0].acting_as(stranger), pytest.raises(NotFoundError) as hidden:
            await hosts[0].get_collective_stats(gamma)
        with hosts[0].acting_as(stranger), pytest.raises(NotFoundError) as never:
            await hosts[0].get_collective_stats(unknown)
        assert str(hidden.value).replace(str(gamma), "?") == str(never.value).replace(
            str(unknown), "?"
        )
        with pytest.raises(NotFollowed, match="it follows alpha"):
            await hosts[0].record_experience(beta, "not here")
        with pytest.raises(NotFollowed, match="owner:acme"):
            await hosts[2].digest(gamma)
        elsewhere = (await full.list_experiences(gamma))[0].experience_id
        with pytest.raises(NotFoundError, match=r"in the collectives this host follows \(alpha\)"):
            await hosts[0].reinforce_experience(elsewhere)
        assert await hosts[0].get_experience(elsewhere) is None  # (a get says None)
        assert [c.name for c in await hosts[0].list_collectives()] == ["alpha"]
        with pytest.raises(ValidationError, match="this host follows only alpha"):
            await hosts[0].create_collective("acme", "epsilon", embedder="hash")
        # its state holds nothing of the others
        found = await hosts[0].sql("SELECT DISTINCT collective_id FROM experiences")
        assert found.rows == [[str(alpha)]]
        # its status: each collective it follows, caught up, and its reader's filters
        status = await hosts[1].status()
        assert status.following == (str(alpha), str(gamma))
        assert [(c.collective_id, c.lag, c.catching_up) for c in status.collectives] == [
            (cid, 0, False) for cid in sorted([alpha, gamma], key=str)
        ]
        assert status.last_seq == max(c.last_seq for c in status.collectives)
        assert status.stream.last_seq >= status.last_seq
        assert any(f"pulse.c.{gamma}.>" in c.filters for c in status.stream.consumers)
    finally:
        for db in (*hosts, full):
            await db.close()


async def test_an_owner_reference_follows_collectives_created_later(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    full = await PulseDB.open(tmp_path / "full", nats_server.url, projection_settings=NO_REWRITE)
    host = await PulseDB.open(
        tmp_path / "host", nats_server.url, projection_settings=NO_REWRITE, collectives="owner:acme"
    )
    try:
        assert host.followed() == []
        later = await full.create_collective("acme", "later", embedder="hash")
        other = await full.create_collective("zeta", "other", embedder="hash")
        await _busy(full, later, "later")
        await eventually(lambda: later in host.followed(), what="the new collective followed")
        await _same(full, host, later)
        assert host.followed() == [later]  # not zeta's
        with pytest.raises(NotFollowed):
            await host.get_collective(other)
        # one it creates itself, of that owner, is followed before it is written
        mine = await host.create_collective("acme", "mine", embedder="hash")
        await _busy(host, mine, "mine")
        await _same(full, host, mine)
    finally:
        await host.close()
        await full.close()


async def test_a_collective_followed_later_is_caught_up_alone(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    full = await PulseDB.open(tmp_path / "full", nats_server.url, projection_settings=NO_REWRITE)
    host = await PulseDB.open(
        tmp_path / "host", nats_server.url, projection_settings=NO_REWRITE, collectives=["alpha"]
    )
    try:
        alpha = await full.create_collective("acme", "alpha", embedder="hash")
        gamma = await full.create_collective("zeta", "gamma", embedder="hash")
        await _busy(full, alpha, "a")
        await _busy(full, gamma, "g", n=6)
        await _same(full, host, alpha)
        applied, backfilled = host.events_applied, host.backfilled

        # at run time: only gamma's events are read and folded, once
        assert await host.follow(["gamma"]) == sorted([alpha, gamma], key=str)
        assert host.following == ("alpha", "gamma")
        await _same(full, host, gamma)
        # its events up to where the host was are backfilled, the rest come by the tail
        read = host.events_applied - applied + host.backfilled - backfilled
        assert read == len(await _history(full, gamma))  # nothing of alpha again
        await _same(full, host, alpha)
        await _busy(full, gamma, "g2")  # and it goes on following it
        await _same(full, host, gamma)
        await host.close()

        # it follows the same after a restart without being told; never fewer
        host = await PulseDB.open(
            tmp_path / "host", nats_server.url, projection_settings=NO_REWRITE
        )
        assert host.following == ("alpha", "gamma")
        await host.close()
        with pytest.raises(ValidationError, match="cannot stop following gamma"):
            await PulseDB.open(
                tmp_path / "host",
                nats_server.url,
                projection_settings=NO_REWRITE,
                collectives=["alpha"],
            )
        plain = await PulseDB.open(
            tmp_path / "plain", nats_server.url, projection_settings=NO_REWRITE
        )  # follows all
        await plain.close()
        with pytest.raises(ValidationError, match="follows every collective"):
            await PulseDB.open(
                tmp_path / "plain",
                nats_server.url,
                projection_settings=NO_REWRITE,
                collectives=["alpha"],
            )

        # a backfill a crash cut short is done again, its history not doubled
        state = next((tmp_path / "host").glob("state-*"))
        kept = json.loads((state / FILE).read_text())
        kept["collectives"][str(gamma)] = await full.sync()
        (state / FILE).write_text(json.dumps(kept))
        host = await PulseDB.open(
            tmp_path / "host", nats_server.url, projection_settings=NO_REWRITE
        )
        await _same(full, host, gamma)
        await _same(full, host, alpha)
    finally:
        await host.close()
        await full.close()


async def test_pulse_up_follow_names_its_scope(tmp_path: Path, nats_server: EmbeddedNats) -> None:
    full = await PulseDB.open(tmp_path / "full", nats_server.url)
    alpha = await full.create_collective("acme", "alpha", embedder="hash")
    gamma = await full.create_collective("zeta", "gamma", embedder="hash")
    await full.record_experience(gamma, "the last event in the log is not alpha's")
    await full.close()
    service = start(tmp_path / "host", "--follow", "alpha", env=_env(nats_server))
    try:
        assert "follows  alpha (1 collectives)" in service.banner
        async with service.client() as client:
            # its lag is measured on what it reads (the log's last event is gamma's)
            health = (await client.get("/health")).json()
            assert health["lag"] == 0 and health["stream_seq"] == health["applied_seq"] == 1
            ok = await client.post("/v1/get_collective", json={"collective_id": str(alpha)})
            assert ok.status_code == 200 and ok.json()["name"] == "alpha"
            refused = await client.post("/v1/get_collective", json={"collective_id": str(gamma)})
            assert refused.status_code == 404, refused.text
            assert refused.json()["error"] == "NotFollowed"
            assert "it follows alpha" in refused.json()["message"]
        shown = subprocess.run(
            [PULSE, "--data-dir", str(tmp_path / "host"), "status"],
            capture_output=True, text=True, timeout=60, env=_env(nats_server),
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        named = subprocess.run(
            [PULSE, "--data-dir", str(tmp_path / "host"), "search", "-c", "gamma", "x"],
            capture_output=True, text=True, timeout=60, env=_env(nats_server),
        )  # fmt: skip
        assert named.returncode == 1
        assert "no collective named 'gamma' among those this host follows (alpha)" in named.stderr
        assert re.search(
            rf"follows   alpha \(1 collectives\)\n  alpha  {alpha}  last \d+, lag 0", shown.stdout
        ), shown.stdout
    finally:
        stop(service)


def _env(server: EmbeddedNats) -> dict[str, str]:
    return clean_env(PULSE_NATS_URL=server.url)
