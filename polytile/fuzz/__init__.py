"""A grammar-aware fuzzer of the front end and of the compiled code.

    python -m polytile.fuzz --cases 100000 --compile-cases 500 --seed 1

Front-end cases are TC programs written from the grammar by hypothesis strategies
(`programs.py`), mostly valid, and mutations of real programs (`mutations.py`): only
a PolytileError may leave `polytile.define`. Compile cases are accepted programs run
through the C backend and the reference interpreter on random inputs, which must
agree (`oracle.py`). `runner.py` drives both and counts outcomes; every failure is
printed as a TC file that replays it (`--replay`).

hypothesis is a test dependency, not a runtime one: it is imported only when a
campaign runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from polytile.errors import UnsupportedError

if TYPE_CHECKING:
    from polytile.fuzz.runner import Campaign, Report


def require_hypothesis() -> None:
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise UnsupportedError(
            "polytile.fuzz needs hypothesis, which is a test dependency of polytile",
            hint="pip install hypothesis (or pip install 'polytile[test]')") from None


def run(campaign: Campaign) -> Report:
    """Run a campaign (see polytile.fuzz.runner.Campaign)."""
    require_hypothesis()
    from polytile.fuzz.runner import run as run_campaign
    return run_campaign(campaign)
