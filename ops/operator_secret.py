"""The local operator's secret: the credential of whoever holds the data directory.

``pulse up`` always wants a credential (``ops.service.Guard``): an access token, or this
secret, which acts as the local operator (``sync.access.Principal.operator``). It lives in
``<data dir>/operator-token``, mode 0600 in a 0700 directory, as Jupyter keeps its token:
a process of the same OS user (the CLI, ``pulse mcp``, ``RemotePulseDB.from_data_dir``)
reads it without ceremony, any other user of the machine cannot, and no web page can.
Revoking access tokens never touches it, so the operator cannot be locked out.

``pulse up`` makes it once and reuses it on every start (an agent host's ``pulse mcp``
that read it keeps working across restarts); ``--token`` (or $PULSE_TOKEN) chooses its
value instead, and it is written here too, so the CLI needs nothing set. Deleting the
file makes ``pulse up`` make a new one on its next start.

Start-up: the CLI reads it once per command; this module imports nothing heavy.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from eventlog.errors import ValidationError

FILE_NAME = "operator-token"
PREFIX = "pulse-operator-"  # never an access token's "pulse_" (sync.access.token_id_of)


def secret_file(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / FILE_NAME


def read_secret(data_dir: str | os.PathLike[str]) -> str | None:
    """The secret of the data directory, or None when there is none this process may read
    (none made yet, or the data directory of another OS user)."""
    try:
        secret = secret_file(data_dir).read_text().strip()
    except OSError:
        return None
    return secret or None


def ensure_secret(data_dir: str | os.PathLike[str], chosen: str | None = None) -> str:
    """The secret of the data directory: ``chosen`` (written to the file when it differs),
    else the one already there, else a new one. The file is made aside with mode 0600 and
    renamed into place, so it is never readable by others, not for an instant, and a
    reader sees a whole secret or none. A file that others could read is refused: its
    secret may have been read (delete it, and a new one is made)."""
    path = secret_file(data_dir)
    Path(data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    found: str | None = None
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        pass
    else:
        if mode & 0o077:
            raise ValidationError(
                f"operator-token: {path} can be read by other users (mode {mode & 0o777:o}); "
                "delete it and start again (pulse up makes a new one, mode 0600)"
            )
        found = path.read_text().strip() or None
    secret = chosen or found or PREFIX + secrets.token_urlsafe(32)
    if secret != found:
        from eventlog.embedded import write_private

        write_private(path, secret + "\n")
    return secret
