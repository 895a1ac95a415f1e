"""The shape of a configuration problem: the error every check raises, and how a message names a bad value.

A module of its own below everything that validates (fedskew.config, its schema and cross-section checks, the
typed training settings of fedskew.training_config), so that each of them reports in the same words.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from typing import Any


class ConfigError(ValueError):
    """params.yaml (or a run's configuration) is invalid; the message lists every problem found."""


def suggestion(name: object, choices: Iterable[object]) -> str:
    """" (did you mean 'fedprox'?)" for a misspelt name, or "" when no defined name is close."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def short_value(value: Any) -> str:
    """A bad value as a message shows it: a string quoted, anything else as JSON, cut at 80 characters."""
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
