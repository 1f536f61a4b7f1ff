"""`pulse token create|list|revoke` and `--visibility`, run as a user runs them: the
installed script where the process matters (what goes to stdout and stderr, exit codes,
no traceback), `ops.cli.main` in this process elsewhere (a second interpreter would only
add start-up time). One `pulse up` serves the module, on a non-loopback address without
--token: an admin access token was created on the data directory before it started, and
the CLI without $PULSE_TOKEN acts as the local operator by the data directory's secret."""

from __future__ import annotations

import calendar
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ops.cli import build_parser, main
from ops.cli.arguments import duration
from ops.cli.tokens import KEEP_TOKEN
from tests.harness import start, stop

PULSE = str(Path(sys.executable).parent / "pulse")
TOKEN = re.compile(r"^pulse_[0-9a-f]{32}_[A-Za-z0-9_-]{43}$")
DAY_MS = 86_400_000
Cli = Callable[..., tuple[int, str, str]]  # (data_dir, *args, token=...): code, stdout, stderr


def _env(token: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    if token is not None:
        env["PULSE_TOKEN"] = token
    return env


def pulse(data_dir: Path, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    """The installed `pulse --data-dir DATA_DIR ARGS...`, with $PULSE_TOKEN = ``token``."""
    return subprocess.run(
        [PULSE, "--data-dir", str(data_dir), *args],
        capture_output=True, text=True, timeout=60, env=_env(token),
    )  # fmt: skip


@dataclass
class Served:
    data_dir: Path
    process: subprocess.Popen[str]
    banner: str
    admin: str  # an admin access token
    team: str  # the id of ana's collective "team"
    url: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data_dir = tmp_path_factory.mktemp("tokens") / "data"
    # on the data directory itself (no service yet): the local operator
    team = pulse(data_dir, "collective", "create", "team", "--owner", "ana", "--embedder", "hash")
    assert team.returncode == 0, team.stderr
    admin = pulse(data_dir, "token", "create", "--owner", "root", "--scope", "admin", "--json")
    assert admin.returncode == 0, admin.stderr
    assert admin.stderr.strip() == KEEP_TOKEN  # with --json, only the reminder
    service = start(data_dir, "--host", "0.0.0.0", env=_env())
    try:
        yield Served(data_dir, service.process, service.banner,
                     json.loads(admin.stdout)["token"], team.stdout.strip(),
                     service.url)  # fmt: skip
    finally:
        stop(service)


@pytest.fixture(autouse=True)
def _no_pulse_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PULSE_NATS_URL", "PULSE_DATA_DIR", "PULSE_TOKEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    """`pulse --data-dir DATA_DIR ARGS...` in this process, as $PULSE_TOKEN = ``token``:
    exit code, stdout, stderr."""

    def run(data_dir: Path, *args: str, token: str | None = None) -> tuple[int, str, str]:
        if token is None:
            monkeypatch.delenv("PULSE_TOKEN", raising=False)
        else:
            monkeypatch.setenv("PULSE_TOKEN", token)
        capsys.readouterr()
        code = main(["--data-dir", str(data_dir), *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def created(cli: Cli, served: Served, *args: str) -> dict[str, Any]:
    """A new token (`pulse token create ARGS --json` as the admin)."""
    code, out, err = cli(served.data_dir, "token", "create", *args, "--json", token=served.admin)
    assert code == 0, err
    record: dict[str, Any] = json.loads(out)
    return record


def files_holding(directory: Path, needle: str) -> list[Path]:
    """Every file under ``directory`` whose bytes contain ``needle``."""
    return [p for p in directory.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


# -- create, list, revoke ---------------------------------------------------------------------


def test_a_token_is_printed_once_and_only_its_hash_is_kept(served: Served, cli: Cli) -> None:
    made = pulse(
        served.data_dir, "token", "create", "--owner", "ana", "--agent", "bot", "-c", "team",
        "--scope", "write", "--expires", "30d", token=served.admin,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert TOKEN.match(secret) and made.stdout == secret + "\n", "the token alone on stdout"
    details = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in made.stderr.splitlines()[:-1])
    token_id = details["token id"]
    assert secret.startswith(f"pulse_{token_id.replace('-', '')}_")
    assert details["owner"] == "ana" and details["agent"] == "bot"
    assert details["scope"] == "write"
    assert details["collectives"] == f"team ({served.team})"
    expires = calendar.timegm(time.strptime(details["expires"], "%Y-%m-%d %H:%M:%SZ"))
    assert abs(expires - time.time() - 30 * 86400) < 120
    assert made.stderr.splitlines()[-1] == KEEP_TOKEN

    default = created(cli, served, "--owner", "ana", "--expires", "12h")
    assert TOKEN.match(default["token"])
    assert (default["owner_id"], default["agent_id"], default["scope"]) == ("ana", None, "read")
    assert default["collectives"] == []
    assert abs(default["expires_ms"] - time.time() * 1000 - DAY_MS / 2) < 120_000
    assert default["expires"].endswith("Z")

    code, listed, err = cli(served.data_dir, "token", "list", token=served.admin)
    assert code == 0, err
    header, rule, *rows, count = listed.strip().splitlines()
    assert header.split() == ["id", "owner", "agent", "scope", "collectives", "expires", "revoked"]
    assert re.search(rf"^{token_id}\s+ana\s+bot\s+write\s+team\s+\d{{4}}-\S+ \S+Z\s+no$",
                     listed, re.M)  # fmt: skip
    assert re.search(rf"^{default['token_id']}\s+ana\s+-\s+read\s+all\s+\S+ \S+Z\s+no$",
                     listed, re.M)  # fmt: skip
    assert count == f"({len(rows)} rows)"
    code, as_json, err = cli(served.data_dir, "token", "list", "--owner", "ana", "--json",
                             token=served.admin)  # fmt: skip
    assert code == 0, err
    mine = {t["token_id"]: t for t in json.loads(as_json)}
    assert {token_id, default["token_id"]} <= set(mine)
    assert {t["owner_id"] for t in mine.values()} == {"ana"}
    assert mine[token_id]["collectives"] == [served.team] and not mine[token_id]["revoked"]
    assert set(mine[token_id]) == {"token_id", "owner_id", "agent_id", "scope", "collectives",
                                   "expires_ms", "revoked"}  # fmt: skip

    for token in (secret, default["token"], served.admin):
        random_part = token.split("_", 2)[2]  # pulse_<id hex>_<43 random characters>
        assert len(random_part) == 43
        assert random_part not in listed + as_json + served.banner
        assert files_holding(served.data_dir, random_part) == [], "a secret reached the disk"
    # what is kept is the SHA-256: it is on the log (so the grep above looks at the log)
    kept = files_holding(served.data_dir, hashlib.sha256(secret.encode()).hexdigest())
    assert any("jetstream" in str(p) for p in kept), kept


def test_a_revoked_token_is_refused_and_listed_with_all(served: Served, cli: Cli) -> None:
    carl = created(cli, served, "--owner", "carl")
    assert cli(served.data_dir, "collective", "list", token=carl["token"])[0] == 0

    revoked = pulse(served.data_dir, "token", "revoke", carl["token_id"], token=served.admin)
    assert revoked.returncode == 0, revoked.stderr
    assert revoked.stdout.strip() == f"revoked token {carl['token_id']}"

    refused = pulse(served.data_dir, "collective", "list", token=carl["token"])
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith(
        "pulse: error: the Pulse service at 127.0.0.1 refused the request (token: token "
        f"{carl['token_id']} was revoked)"
    )
    assert "$PULSE_TOKEN" in refused.stderr and len(refused.stderr.splitlines()) == 1

    code, live, _ = cli(served.data_dir, "token", "list", "--json", token=served.admin)
    assert carl["token_id"] not in {t["token_id"] for t in json.loads(live)}
    code, every, _ = cli(served.data_dir, "token", "list", "--all", "--json", token=served.admin)
    assert {t["token_id"]: t["revoked"] for t in json.loads(every)}[carl["token_id"]] is True
    code, text, _ = cli(served.data_dir, "token", "list", "--all", token=served.admin)
    assert re.search(rf"^{carl['token_id']}\s.*\syes$", text, re.M), text
    # revoking again (here by the token itself, not its id) is harmless
    again = cli(served.data_dir, "token", "revoke", carl["token"], "--json", token=served.admin)
    assert again[0] == 0 and json.loads(again[1]) == {"revoked": carl["token_id"]}


def test_token_management_needs_an_admin_and_says_so_in_one_line(served: Served, cli: Cli) -> None:
    operator = pulse(served.data_dir, "token", "list")  # no $PULSE_TOKEN: the operator
    assert operator.returncode == 0 and "root" in operator.stdout, operator.stderr

    writer = created(cli, served, "--owner", "ana", "--agent", "w", "--scope", "write")
    forbidden = pulse(served.data_dir, "token", "create", "--owner", "ana", "--scope", "admin",
                      token=writer["token"])  # fmt: skip
    assert forbidden.returncode == 1 and forbidden.stdout == ""
    assert forbidden.stderr == (
        "pulse: error: scope: creating tokens needs an admin token; owner 'ana', agent 'w' "
        "(write) has none\n"
    )
    for args in (("token", "list"), ("token", "revoke", writer["token_id"])):
        code, _, err = cli(served.data_dir, *args, token=writer["token"])
        assert code == 1 and err.startswith("pulse: error: scope: ") and "admin" in err
    garbage = cli(served.data_dir, "token", "list", token="not-a-token")
    assert garbage[0] == 1 and "token: not a Pulse token" in garbage[2]


def test_expires_takes_a_duration_and_names_the_option_when_it_is_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = subprocess.run(
        [PULSE, "token", "create", "--owner", "ana", "--expires", "5x"],
        capture_output=True, text=True, timeout=60, env=_env(),
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        "pulse token create: error: argument --expires: a duration like 30d, 12h, 45m, 90s "
        "or 2w, got '5x'"
    )
    assert [duration(t) for t in ("90s", "45m", "12h", "30d", "2w")] == [
        90, 2700, 43200, 2592000, 1209600]  # fmt: skip
    for given, why in (("30", "a duration like"), ("0d", "must be longer than 0"),
                       ("1y", "a duration like"), ("600w", "at most 3650d")):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(["token", "create", "--owner", "a", "--expires", given])
        assert exited.value.code == 2
        assert f"argument --expires: {why}" in capsys.readouterr().err


def test_tokens_on_the_data_directory_itself(tmp_path: Path, cli: Cli) -> None:
    """No `pulse up`: the CLI opens the data directory, as the local operator."""
    data_dir = tmp_path / "data"
    code, out, err = cli(data_dir, "token", "list")
    assert (code, out.strip()) == (0, "no tokens (revoked ones: --all)"), err
    code, out, err = cli(data_dir, "token", "create", "--owner", "ana", "--scope", "admin")
    assert code == 0 and TOKEN.match(out.strip()), err
    token_id = re.search(r"^token id\s+(\S+)$", err, re.M).group(1)  # type: ignore[union-attr]
    assert cli(data_dir, "token", "revoke", token_id, "--idempotency-key", "k1")[0] == 0
    code, out, _ = cli(data_dir, "token", "list", "--all", "--json")
    assert [(t["token_id"], t["revoked"]) for t in json.loads(out)] == [(token_id, True)]
    code, _, err = cli(data_dir, "token", "create", "--owner", "ana", "-c", "nowhere")
    assert code == 1
    assert err == "pulse: error: collective: no collective named 'nowhere' of owner 'ana'\n"


def test_an_access_token_holds_on_the_data_directory_too(tmp_path: Path, cli: Cli) -> None:
    """Without `pulse up`, $PULSE_TOKEN still decides who the command acts for."""
    data_dir = tmp_path / "data"
    assert cli(data_dir, "collective", "create", "team", "--owner", "ana", "--embedder",
               "hash")[0] == 0  # fmt: skip
    code, reader, err = cli(data_dir, "token", "create", "--owner", "ana", "--scope", "read")
    assert code == 0, err
    code, _, err = cli(data_dir, "record", "-c", "team", "read only", token=reader.strip())
    assert code == 1 and "may only read" in err and len(err.splitlines()) == 1
    code, _, err = cli(data_dir, "token", "list", token=reader.strip())
    assert code == 1 and "needs an admin token" in err
    assert cli(data_dir, "token", "list")[0] == 0  # the local operator, as before


# -- visibility ---------------------------------------------------------------------------------


def test_visibility_is_kept_and_decides_who_sees(served: Served, cli: Cli) -> None:
    bot = created(cli, served, "--owner", "ana", "--agent", "bot", "-c", "team", "--scope", "write")
    eve = created(cli, served, "--owner", "ana", "--agent", "eve")  # another agent, same owner
    bob = created(cli, served, "--owner", "bob", "--scope", "write")  # another owner

    def as_(who: dict[str, Any], *args: str) -> str:
        code, out, err = cli(served.data_dir, *args, token=who["token"])
        assert code == 0, err
        return out.strip()

    private = as_(bot, "record", "-c", "team", "lighthouse plan, mine", "--visibility", "private")
    team = as_(bot, "record", "-c", "team", "lighthouse notes for the team")
    org = as_(bot, "record", "-c", served.team, "lighthouse notice", "--visibility", "org")
    got = json.loads(as_(bot, "get", private, "--json"))
    assert (got["visibility"], got["author_owner"], got["author_agent"]) == (
        "private", "ana", "bot")  # fmt: skip

    def seen(who: dict[str, Any]) -> set[str]:
        hits = as_(who, "search", "-c", served.team, "lighthouse", "--mode", "text", "--json")
        return {h["experience"]["experience_id"] for h in json.loads(hits)}

    assert seen(bot) == {private, team, org}
    assert seen(eve) == {team, org}
    # the installed script, as bob: the org notice only; the private plan does not exist
    searched = pulse(served.data_dir, "search", "-c", served.team, "lighthouse", "--mode",
                     "text", "--json", token=bob["token"])  # fmt: skip
    assert searched.returncode == 0, searched.stderr
    assert [h["experience"]["experience_id"] for h in json.loads(searched.stdout)] == [org]
    for who in (bob, eve):
        code, _, err = cli(served.data_dir, "get", private, token=who["token"])
        assert (code, err) == (1, f"pulse: error: experience_id: no experience {private}\n")

    relation = as_(bot, "relate", private, "Supports", team, "--visibility", "private")
    insight = as_(bot, "insight", "add", "-c", "team", "lighthouses help", "--source", team,
                  "--visibility", "org")  # fmt: skip
    wisdom = as_(bot, "wisdom", "add", "keep a lighthouse", "--owner", "ana", "--category",
                 "CodingStyle", "--embedding", "[1, 0]", "--visibility", "private")  # fmt: skip
    stored = as_(
        {"token": served.admin}, "sql", "--json",
        "SELECT relation_id AS id, visibility, author_agent FROM relations UNION ALL "
        "SELECT insight_id, visibility, author_agent FROM insights UNION ALL "
        "SELECT wisdom_id, visibility, author_agent FROM wisdom",
    )  # fmt: skip
    assert {r["id"]: (r["visibility"], r["author_agent"]) for r in json.loads(stored)} == {
        relation: ("private", "bot"),
        insight: ("org", "bot"),
        wisdom: ("private", "bot"),
    }
    assert as_(bob, "wisdom", "list", "--owner", "ana") == "no wisdom"


# -- pulse up -------------------------------------------------------------------------------------


def test_up_wants_a_credential_on_every_address_and_says_how(served: Served) -> None:
    # the module's service listens on 0.0.0.0 without --token: the operator secret guards
    secret = served.data_dir / "operator-token"
    assert re.search(
        rf'^  access   a credential on every request; as the operator: curl -H "Authorization: '
        rf'Bearer \$\(cat {re.escape(str(secret))}\)" http://127\.0\.0\.1:\d+/health$',
        served.banner, re.M), served.banner  # fmt: skip
    assert secret.stat().st_mode & 0o777 == 0o600
    with httpx.Client(base_url=served.url, timeout=30) as client:
        refused = client.post("/v1/list_collectives", json={})
        assert refused.status_code == 401, refused.text
        operator = {"Authorization": f"Bearer {secret.read_text().strip()}"}
        assert client.post("/v1/list_collectives", json={}, headers=operator).status_code == 200


def test_up_takes_no_access_token_for_its_own(tmp_path: Path, cli: Cli) -> None:
    """An access token in $PULSE_TOKEN (there for the CLI) must not become the service's
    token: whoever sends that acts as the local operator."""
    access_token = "pulse_" + "0" * 32 + "_" + "A" * 43
    for args, token, where in (
        (("--token", access_token), None, "--token"), ((), access_token, "$PULSE_TOKEN"),
    ):  # fmt: skip
        code, out, err = cli(tmp_path / "data", "up", *args, token=token)
        assert code == 1 and out == ""
        assert err.startswith(f"pulse: error: token: {where} holds an access token"), err
    assert not (tmp_path / "data").exists()  # refused before anything started
