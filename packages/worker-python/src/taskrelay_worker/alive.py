"""``python -m taskrelay_worker.alive``: the liveness probe of a Python worker container (deploy/k8s, the Helm chart),
as the Node worker's ``dist/alive.js``. Exits 1 only when Redis answers and no worker of this host has a live
heartbeat (worker ids start with the hostname, which is the pod's name), so a wedged worker is restarted. Exits 0 while
one does, and also when Redis cannot be reached: a Redis outage is not this container's fault, and restarting every
worker would not end it. Reads the worker's environment (REDIS_URL / REDIS_CLUSTER_NODES / REDIS_SENTINELS,
TASKRELAY_PREFIX); TASKRELAY_TOOLS is not needed here."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time

from .config import ConfigError, load_config
from .engine import is_redis_loss, make_client
from .keys import Keys

PROBE_TIMEOUT_S = 3.0


async def probe() -> int:
    # The probe serves no tools: a placeholder keeps load_config's TASKRELAY_TOOLS check from refusing it.
    config = load_config({"TASKRELAY_TOOLS": "-", **os.environ})
    keys = Keys(config.prefix, config.key_layout)
    client = make_client(config.redis)
    try:
        live = await asyncio.wait_for(client.zrangebyscore(keys.workers, int(time.time() * 1000), "+inf"), PROBE_TIMEOUT_S)
        mine = f"{socket.gethostname()}-"
        if any(worker_id.startswith(mine) for worker_id in live):
            return 0
        sys.stderr.write(f"taskrelay-worker-alive: no live heartbeat from a worker of {socket.gethostname()}\n")
        return 1
    except (asyncio.TimeoutError, TimeoutError):
        return 0
    except Exception as error:  # noqa: BLE001 - any other failure is one line and exit 1
        if is_redis_loss(error):
            return 0
        sys.stderr.write(f"taskrelay-worker-alive: {error}\n")
        return 1
    finally:
        try:
            await client.aclose()
        except Exception:  # noqa: BLE001 - closing a client that never connected
            pass


def main() -> None:
    try:
        code = asyncio.run(probe())
    except ConfigError as error:
        sys.stderr.write(f"taskrelay-worker-alive: {' '.join(str(error).split())}\n")
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
