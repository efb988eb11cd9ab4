"""Checks a taskrelay-worker wheel against the build's generated scripts (.ci/run): the wheel carries
``taskrelay_worker/_generated/manifest.json`` and every script it names, each the same bytes as in the folder the Node
build wrote, and nothing else there. One line per difference, exit 1; one line and exit 0 when they match.

    python3 scripts/check-wheel.py dist/taskrelay_worker-0.2.0-py3-none-any.whl \\
        packages/worker-python/src/taskrelay_worker/_generated
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

PREFIX = "taskrelay_worker/_generated/"


def differences(wheel: Path, built: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        inside = {n[len(PREFIX) :]: archive.read(n) for n in archive.namelist() if n.startswith(PREFIX)}
    if "manifest.json" not in inside:
        return [f"{wheel.name} has no {PREFIX}manifest.json"]
    manifest = json.loads(inside["manifest.json"])
    expected = {"manifest.json", *(s["file"] for s in manifest["scripts"].values())}
    problems = [f"{wheel.name} lacks {PREFIX}{f}" for f in sorted(expected - set(inside))]
    problems += [f"{wheel.name} has {PREFIX}{f}, which the manifest does not name" for f in sorted(set(inside) - expected)]
    for name in sorted(expected & set(inside)):
        on_disk = built / name
        if not on_disk.is_file():
            problems.append(f"{PREFIX}{name} is in the wheel but not in {built} (the build's output)")
        elif on_disk.read_bytes() != inside[name]:
            problems.append(f"{PREFIX}{name} differs from {on_disk}: the wheel was not built from this checkout's scripts")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: check-wheel.py WHEEL GENERATED_DIR", file=sys.stderr)
        return 2
    wheel, built = Path(argv[0]), Path(argv[1])
    problems = differences(wheel, built)
    for line in problems:
        print(line, file=sys.stderr)
    if not problems:
        print(f"{wheel.name} carries the build's {len(list(built.iterdir()))} generated files")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
