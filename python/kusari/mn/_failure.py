"""The failure path of a Python rank (Note [A Python rank that fails] in python/src/mn.cc)."""

import sys
import traceback

from kusari import _kusari

_previous_hook = None


def _hook(exc_type, exc, tb):
    if issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
        _previous_hook(exc_type, exc, tb)
        return
    text = ''.join(traceback.format_exception(exc_type, exc, tb)).rstrip()
    # (Returns only with KUSARI_MN_ABORT_ON_ERROR=0: then Python's own ending follows.)
    _kusari.mn._report_failure_and_exit(text)
    _previous_hook(exc_type, exc, tb)


def install():
    """Makes an uncaught exception end the whole job through kusari's failure path."""
    global _previous_hook
    if _previous_hook is None:
        _previous_hook = sys.excepthook
        sys.excepthook = _hook
