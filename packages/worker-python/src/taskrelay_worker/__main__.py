"""``python -m taskrelay_worker``: serves the tools of the module ``TASKRELAY_TOOLS`` names (a ``.py`` file or a
module name), with the Node worker's environment. A bad configuration or an unreachable Redis is one line on stderr
and exit code 1; SIGTERM or SIGINT drains (PROTOCOL.md §21.1), a second one exits at once with code 1."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import signal
import sys
from pathlib import Path

from .config import ConfigError, load_config
from .engine import StartError, TaskrelayWorker
from .isolate import check_isolated_tools
from .log import Logger
from .metrics import MetricsServer
from .tracing import start_tracing
from .tools import ToolDefinition, collect_tools


def load_tools(spec: str) -> list[ToolDefinition]:
    try:
        if spec.endswith(".py") or os.sep in spec or "/" in spec:
            path = Path(spec).resolve()
            if not path.is_file():
                raise ConfigError(f"Invalid configuration: TASKRELAY_TOOLS names no file: {path}")
            module_spec = importlib.util.spec_from_file_location(f"taskrelay_tools_{path.stem}", path)
            if module_spec is None or module_spec.loader is None:
                raise ConfigError(f"Invalid configuration: TASKRELAY_TOOLS could not load {path}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(spec)
        return collect_tools(vars(module))
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever the module raised is the line to print
        raise ConfigError(f"Invalid configuration: TASKRELAY_TOOLS could not load {spec}: {error}") from None


async def serve() -> int:
    # First: until a process handles SIGTERM, the default ends it at once. A SIGTERM sent on seeing "worker ready"
    # must drain; one that comes while the worker starts drains it as soon as it has started.
    stop = asyncio.Event()
    log: Logger | None = None  # set once the configuration is read

    def on_signal(signum: signal.Signals) -> None:
        if not stop.is_set():
            stop.set()
            return
        # A second signal, as the Node worker's: exit now, without waiting for running tools.
        if log is not None:
            log.warn("second signal; exiting without waiting for running tools", signal=signum.name)
        os._exit(1)

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    config = load_config(os.environ)
    tools = load_tools(config.tools)
    try:
        check_isolated_tools(tools, load_tools)
    except ValueError as error:
        raise ConfigError(f"Invalid configuration: {error}") from None
    log = Logger(config.log_level, {"name": "worker", "language": "python"})
    tracing = start_tracing("taskrelay-worker", os.environ)
    worker = TaskrelayWorker(config, tools, log)
    await worker.start()
    metrics_server = None
    if config.metrics_port is not None:
        try:
            metrics_server = MetricsServer(worker.metrics.registry, config.metrics_host, config.metrics_port)
        except OSError as error:
            await worker.close()
            raise ConfigError(
                f"Invalid configuration: WORKER_METRICS_PORT {config.metrics_port} cannot be served: {error}"
            ) from None
        log.info("metrics served", metricsPort=metrics_server.port)
    await stop.wait()
    await worker.close()
    if metrics_server is not None:
        metrics_server.close()
    tracing.shutdown()
    return 0


def main() -> None:
    try:
        code = asyncio.run(serve())
    except (ConfigError, StartError) as error:
        sys.stderr.write(f"taskrelay-worker: {' '.join(str(error).split())}\n")
        sys.exit(1)
    sys.exit(code)


if __name__ == "__main__":
    main()
