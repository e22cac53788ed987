"""`python -m tinytrain` with every host read of the process counted (tests/host_reads.py), for
tests/integration/test_host_reads.py.

Usage: TT_TEST_HOST_READS=<file.json> python -m tests.integration.host_reads_cli <tinytrain overrides...>
Writes [[frame, ...], ...]: for each read asked for in tinytrain's own code, the frames outside
torch, innermost first ("tinytrain/train/fit.py:12", "lightning/pytorch/...")."""

import itertools
import json
import os
import sys


def asked_by_tinytrain(chain: tuple[str, ...]) -> bool:
    """A read asked for in tinytrain's code, not by a collator the data loader called (the
    outermost of the innermost run of tinytrain frames is then in tinytrain/data/)."""
    ours = list(itertools.takewhile(lambda frame: frame.startswith("tinytrain/"), chain))
    return bool(ours) and not ours[-1].startswith("tinytrain/data/")


def main() -> None:
    from tests.host_reads import HostReads
    from tinytrain import cli

    sys.argv = ["tinytrain", *sys.argv[1:]]
    reads = HostReads(sites=True)
    try:
        with reads:
            cli.main()
    finally:
        with open(os.environ["TT_TEST_HOST_READS"], "w") as f:
            json.dump([chain for chain in reads.sites if asked_by_tinytrain(chain)], f)


if __name__ == "__main__":
    main()
