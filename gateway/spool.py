"""What a stopping gateway process still owes the database or Redis is kept on disk, and the next process to
start hands it over: nothing metered is lost when a process stops during an outage.

At shutdown (the ASGI lifespan's ``shutdown``, after the server has finished its open requests) the process waits
up to SHUTDOWN_WAIT_S for its usage rows and settles; what is left is written to one JSON-lines file under
settings.GATEWAY_SPOOL_DIR. At startup every process replays every file there in the background (rows through its
usage writer, settles until Redis takes them) and deletes a file once all of it is handed over. Replaying twice
(two processes starting together, a crash mid-replay) is harmless: a usage row is written once per request id
and a reservation settles once.
"""

import asyncio
import dataclasses
import json
import logging
import os
import time
import uuid
from datetime import datetime
from pathlib import Path

from django.conf import settings

from gateway import metering
from tenants.limiter import Reservation

logger = logging.getLogger("gateway.spool")
SHUTDOWN_WAIT_S = 10.0


def spool_dir() -> Path:
    return Path(settings.GATEWAY_SPOOL_DIR)


async def drain_and_spool() -> Path | None:
    """Wait up to SHUTDOWN_WAIT_S for this event loop's rows and settles; keep the rest on disk. The file, if any."""
    writer = metering.loop_usage_writer()
    deadline = time.monotonic() + SHUTDOWN_WAIT_S
    while (writer.pending or metering.unsettled()) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    rows, settles = writer.unwritten(), metering.unsettled()
    if not rows and not settles:
        return None
    lines = [json.dumps({"usage_row": {**row, "created_at": row["created_at"].isoformat()}}) for row in rows]
    lines += [json.dumps({"settle": {"reservation": dataclasses.asdict(reservation), "prompt_tokens": prompt,
                                     "completion_tokens": completion, "request_id": request_id,
                                     "ended_at": ended_at}})
              for reservation, prompt, completion, request_id, ended_at in settles]
    path = spool_dir() / f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text("\n".join(lines) + "\n")
    os.replace(partial, path)  # whole or absent: a replay never reads half a file
    logger.error("stopping with %d usage row(s) and %d settle(s) not handed over; kept in %s", len(rows),
                 len(settles), path)
    return path


async def replay() -> int:
    """Hand every spooled row and settle to this process's writer and Redis; the number of files replayed."""
    files = sorted(spool_dir().glob("*.jsonl"))
    for path in files:
        try:
            items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except FileNotFoundError:  # another process replayed it
            continue
        except (OSError, ValueError) as exc:
            logger.error("spool file %s unreadable, left in place: %r", path, exc)
            continue
        writer = metering.loop_usage_writer()
        waits = []
        for item in items:
            if "usage_row" in item:
                row = item["usage_row"]
                waits.append(writer.submit({**row, "created_at": datetime.fromisoformat(row["created_at"])}))
            elif "settle" in item:
                settle = item["settle"]
                waits.append(metering.spawn(metering.settle_until_taken(
                    Reservation(**settle["reservation"]), settle["prompt_tokens"], settle["completion_tokens"],
                    settle["request_id"], None, settle["ended_at"])))
        results = await asyncio.gather(*waits, return_exceptions=True)
        refused = sum(isinstance(result, Exception) for result in results)
        path.unlink(missing_ok=True)
        logger.warning("replayed %s: %d item(s), %d refused by the database", path, len(items), refused)
    return len(files)


async def lifespan(receive, send) -> None:
    """The ASGI lifespan protocol: replay the spool at startup (in the background), drain and spool at shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            metering.spawn(_replay_logged())
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            try:  # what the replay handed over and is not written yet is in the writer and kept again
                await drain_and_spool()
            except Exception:  # logged; the server must still stop
                logger.exception("could not keep the unwritten usage on disk")
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _replay_logged() -> None:
    try:
        await replay()
    except Exception:  # the files stay for the next start
        logger.exception("replaying the usage spool failed")
