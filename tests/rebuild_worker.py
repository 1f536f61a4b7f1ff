"""`pulse catch-up` or `pulse rebuild` killed with SIGKILL mid-run, at a chosen point.
Driven by tests/test_rebuild.py.

    python -m tests.rebuild_worker DATA_DIR COMMAND CHECKPOINT_EVERY BATCH KILL_AFTER

Runs the command line, ``pulse --data-dir DATA_DIR COMMAND --checkpoint-every
CHECKPOINT_EVERY``, in this process, with the log read in batches of at most BATCH
events (``ProjectionSettings.batch_size``) instead of 5,000, so that a short log is many
batches. Once its progress (a line each tenth of the way) reaches KILL_AFTER events
done, the process prints "killed at <events done>" and kills itself with SIGKILL: the
batches read after the last one reported are being applied then. If the command ends
before that, it exits with status 3.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from typing import Any

from projections.projection import Progress, ProjectionSettings
from sync import maintenance


def killing(progress: Progress | None, kill_after: int) -> Progress:
    def report(done: int, total: int) -> None:
        if progress is not None:
            progress(done, total)
        if done >= kill_after:
            print(f"killed at {done}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    return report


def main(argv: list[str]) -> int:
    data_dir, command, every, batch, kill_after = argv
    for name in ("catch_up", "rebuild"):
        run = getattr(maintenance, name)

        def small_batches(
            *args: Any,
            settings: ProjectionSettings | None = None,
            progress: Progress | None = None,
            _run: Any = run,
        ) -> Any:
            settings = dataclasses.replace(settings or ProjectionSettings(), batch_size=int(batch))
            return _run(*args, settings=settings, progress=killing(progress, int(kill_after)))

        setattr(maintenance, name, small_batches)

    from ops.cli import main as pulse

    pulse(["--data-dir", data_dir, command, "--checkpoint-every", every])
    print(f"pulse {command} ended before {kill_after} events", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
