"""What the command-line entry points share: user errors as one clear line, not a traceback."""

from __future__ import annotations

import os
import sys

from ..maps.roadmap import MapError
from .validate import ConfigError

# errors that describe bad input (config values, missing files or maps, a server that does not
# answer); anything else is a bug and keeps its traceback
USER_ERRORS = (MapError, ValueError, FileNotFoundError, KeyError, TypeError, MemoryError,
               ConnectionError)


def run_cli(fn, *args):
    try:
        return fn(*args)
    except USER_ERRORS as e:
        if os.environ.get("DRIVEMIND_DEBUG"):
            raise
        msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        if isinstance(e, ConfigError):  # a setting out of range: the line says it all
            print(f"error: {msg}", file=sys.stderr, flush=True)
            sys.exit(2)
        print(f"error: {msg}\n(set DRIVEMIND_DEBUG=1 for the traceback)", file=sys.stderr, flush=True)
        sys.exit(2)
