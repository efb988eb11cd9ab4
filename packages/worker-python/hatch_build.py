"""The wheel's build hook: makes ``src/taskrelay_worker/_generated/`` (the task store's Lua scripts and their
``manifest.json``, PROTOCOL.md §29.2) at build time, as BullMQ's Python port copies its Lua at build. The files are
never committed; the Node build writes the same ones (scripts/build.mjs), so an editable install finds them too.

- In a taskrelay checkout (``../shared`` is here): runs ``node packages/shared/emit-python-lua.mjs``, after
  ``node scripts/build.mjs`` when the shared package is not built yet. Node 20+ and ``pnpm install`` are needed.
- From an sdist (no ``../shared``): the sdist carries the files; they are checked, not made.

A build that can make neither stops with one line saying what to run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

GENERATED = Path("src/taskrelay_worker/_generated")


class ProtocolFilesHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        package = Path(self.root)
        repository = package.parent.parent
        emitter = repository / "packages/shared/emit-python-lua.mjs"
        if emitter.is_file():
            self._emit(repository, emitter)
        manifest = package / GENERATED / "manifest.json"
        if not manifest.is_file():
            raise SystemExit(
                f"taskrelay-worker: {GENERATED}/manifest.json is missing and this is no taskrelay checkout to make it "
                "from: build the wheel from the repository (pip wheel packages/worker-python) or from its sdist"
            )
        scripts = json.loads(manifest.read_text(encoding="utf-8"))["scripts"]
        missing = [s["file"] for s in scripts.values() if not (package / GENERATED / s["file"]).is_file()]
        if missing:
            raise SystemExit(f"taskrelay-worker: {GENERATED} lacks {', '.join(missing)}: rebuild it (pnpm build)")

    def _emit(self, repository: Path, emitter: Path) -> None:
        node = shutil.which("node")
        if node is None:
            raise SystemExit(
                "taskrelay-worker: building from a checkout needs Node 20+ on PATH (the build hook runs "
                "packages/shared/emit-python-lua.mjs); install Node, then `pnpm install`"
            )
        built = ("packages/shared/dist/protocol/scripts.js", "packages/worker/dist/context-surface.js")
        if not all((repository / path).is_file() for path in built):
            self._run([node, "scripts/build.mjs"], repository)
        self._run([node, str(emitter.relative_to(repository))], repository)

    @staticmethod
    def _run(argv: list[str], cwd: Path) -> None:
        done = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            raise SystemExit(
                f"taskrelay-worker: `{' '.join(Path(argv[0]).name if i == 0 else a for i, a in enumerate(argv))}` "
                f"failed in {cwd} (exit {done.returncode}):\n{done.stdout.strip()}"
            )
