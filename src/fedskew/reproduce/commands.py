"""`python -m fedskew claims`: the papers' claims ledger, or with `--file` a ledger of one's own claims.

The parser and the command live here, beside the ledgers they write (`ledger`, `own_ledger`), and the CLI
registers them; both ledgers are imported only when the command runs, so that `--help` and the other commands
import neither numpy nor torch.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fedskew import paths

log = logging.getLogger("fedskew")


def add_parser(sub) -> None:
    """The `claims` command and its arguments, on the CLI's subcommands."""
    p = sub.add_parser("claims", help="the claims ledger: every paper claim with its verdict (results/claims.md); "
                                      "with --file, a ledger of your own claims (results/claims/<name>.md)")
    p.add_argument("--file", type=Path, metavar="CLAIMS",
                   help="a claims file of your own (experiments/claims/<name>.yaml): checks it, then writes "
                        "results/claims/<name>.md and .json from its suites' runs")


def cmd_claims(params, args) -> None:
    from fedskew.reproduce.claim import VERDICTS

    claims_file = getattr(args, "file", None)
    if claims_file is not None:
        from fedskew.reproduce.own_ledger import write_own_ledger

        records, written = write_own_ledger(params, claims_file)
        where = f"{written}: "
    else:
        from fedskew.reproduce.ledger import write_ledger

        records = write_ledger(params, Path(paths.CLAIMS.format(ext="md")), Path(paths.CLAIMS.format(ext="json")))
        where = ""
    counts = ", ".join(f"{sum(r['verdict'] == v for r in records)} {v}" for v in VERDICTS)
    log.info("%s%d claims: %s", where, len(records), counts)
