"""Parse an OpenDRIVE text in a child process first, so a file that crashes the native parser
(``carla.Map`` and the lane walk of :func:`drivemind.maps.opendrive.carla_lane_records`) gives one
:class:`MapError` naming the file instead of killing the process with no message.

The verdict is cached per content (sha256 of the text, the ``carla`` client's version and
:data:`CHECK_VERSION`): in memory for the process and as a small file under
``$DRIVEMIND_CACHE/map-check`` (default ``~/.cache/drivemind/map-check``), so a file costs the
child process once per machine. ``DRIVEMIND_MAP_CHECK=0`` turns the check off;
``DRIVEMIND_MAP_CHECK_TIMEOUT`` (seconds, default 300) bounds the child.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from .. import paths
from .roadmap import MapError

log = logging.getLogger(__name__)

ENV_SWITCH = "DRIVEMIND_MAP_CHECK"
ENV_TIMEOUT = "DRIVEMIND_MAP_CHECK_TIMEOUT"
CHECK_VERSION = 3  # bump when the child's work changes (old verdicts are then ignored)
OK_MARK = "drivemind-map-check: ok"
# the package root (…/src) for the child's sys.path, so it imports this very drivemind
_SRC = str(Path(__file__).resolve().parents[2])
_CHILD = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from drivemind.maps.native_check import _child_main; _child_main(sys.argv[2], sys.argv[3])"
)
_verdicts: dict[str, dict] = {}  # in-process memo: key -> verdict


def cache_dir() -> Path:
    return paths.cache_dir() / "map-check"


def _carla_version() -> str:
    try:
        from importlib.metadata import version

        return version("carla")
    except Exception:  # pragma: no cover - not installed as a distribution
        return "unknown"


def verdict_key(text: str) -> str:
    h = hashlib.sha256(text.encode("utf-8", "surrogatepass"))
    h.update(f"|carla={_carla_version()}|check={CHECK_VERSION}".encode())
    return h.hexdigest()[:40]


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _crash_error(source: str, verdict: dict) -> MapError:
    return MapError(
        f"{source}: the CARLA OpenDRIVE parser crashes on this file ({verdict['signal']} in a "
        f"child process that parsed it first; this process was not affected). The file is "
        f"malformed in a way the native parser does not report: re-export it from the editor that "
        f"made it, or check it with an OpenDRIVE validator (dangling road/junction links and lane "
        f"sections without lanes are common causes). Set {ENV_SWITCH}=0 to parse it in-process "
        f"anyway (the process may then die with no message).")


def check_text(text: str, name: str, source: str, *, child_code: str | None = None) -> dict:
    """Parse ``text`` in a child process (unless a cached verdict exists) and raise a MapError
    naming ``source`` if the parser crashed there. Returns the verdict: ``{"status": "ok" |
    "crash" | "error" | "skipped", ...}`` ("error": the child raised a Python error, which the
    in-process load then reports itself). ``child_code`` replaces the child's program (tests)."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return {"status": "skipped"}
    key = verdict_key(text)
    if child_code is None:
        verdict = _verdicts.get(key) or _read_cached(key)
        if verdict is not None:
            _verdicts[key] = verdict
            if verdict["status"] == "crash":
                raise _crash_error(source, verdict)
            return {**verdict, "cached": True}
    verdict = _run_child(text, name, source, child_code)
    if verdict["status"] == "crash" and child_code is None:
        # carla 0.9.16's next_until_lane_end dies on a lane that ends inside its road with no way
        # on (a lane drop: esmini's two_plus_one) or whose lane sections are not linked: walk the
        # lanes a step at a time instead (slower, the same points to within a step at the end)
        stepped = _run_child(text, name, source, None, walk="step")
        if stepped["status"] == "ok":
            verdict = {"status": "ok", "walk": "step", "native": verdict["signal"]}
            log.info("%s: the CARLA lane walk crashes on this file (%s in a child process); its "
                     "lanes are read a step at a time", source, verdict["native"])
    if verdict["status"] in ("ok", "crash") and child_code is None:
        _verdicts[key] = verdict
        _write_cached(key, verdict)
    if verdict["status"] == "crash":
        raise _crash_error(source, verdict)
    return verdict


def _run_child(text: str, name: str, source: str, child_code: str | None,
               walk: str = "native") -> dict:
    timeout = float(os.environ.get(ENV_TIMEOUT) or 300)
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    cmd = [sys.executable, "-c", child_code or _CHILD, _SRC, name, walk]
    try:
        proc = subprocess.run(cmd, input=text.encode("utf-8", "surrogatepass"), capture_output=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise MapError(f"{source}: the CARLA OpenDRIVE parser did not finish within {timeout:.0f} s "
                       f"in a child process (set {ENV_TIMEOUT}=<seconds> for a larger file, or "
                       f"{ENV_SWITCH}=0 to skip this check)") from exc
    except OSError as exc:  # cannot start a process here: parse in-process as before
        log.warning("could not start the map-check child process (%s); parsing %s in-process",
                    exc, source)
        return {"status": "error", "detail": str(exc)}
    if proc.returncode < 0:
        return {"status": "crash", "signal": _signal_name(-proc.returncode)}
    out = proc.stdout.decode("utf-8", "replace")
    if proc.returncode == 0 and OK_MARK in out:
        return {"status": "ok"}
    err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    return {"status": "error", "returncode": proc.returncode, "detail": err[-1] if err else ""}


def _read_cached(key: str) -> dict | None:
    try:
        verdict = json.loads((cache_dir() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    return verdict if isinstance(verdict, dict) and verdict.get("status") in ("ok", "crash") else None


def _write_cached(key: str, verdict: dict) -> None:
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        paths.write_text_atomic(d / f"{key}.json", json.dumps(verdict))
    except OSError as exc:  # a read-only home: the check just runs again next time
        log.debug("could not cache the map-check verdict in %s: %s", d, exc)


def _child_main(name: str, walk: str = "native") -> None:
    """In the child: parse stdin's text and walk its lanes as the loader does (``walk``: see
    :func:`drivemind.maps.opendrive.carla_lane_records`)."""
    from .opendrive import carla_lane_records, parse_carla_map

    text = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
    cmap = parse_carla_map(text, name, "<stdin>")
    carla_lane_records(cmap, name=name, source="<stdin>", walk=walk)
    print(OK_MARK, flush=True)
