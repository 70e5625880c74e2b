"""Running a party of a remote round as its own OS process, with the packages it must not
use made unimportable (a holder: no Ray, no server, no shuffler, no torch; the shuffler
service: no Ray, no server). Every attempt to import one is written to ``$RKNN_BLOCK_LOG``,
so a trial (jobs/trial.py) and the tests see both that a party ran without them and that
it never tried.
"""
from __future__ import annotations

HOLDER_BLOCKED = ("ray", "server", "shuffler", "actors", "torch")
SHUFFLER_BLOCKED = ("ray", "server")


def block_finder(blocked: tuple, party: str) -> str:
    """Python source that makes the top-level packages ``blocked`` unimportable in ``party``'s
    process, logging every attempt to $RKNN_BLOCK_LOG."""
    return """
import os, sys
class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in %r:
            with open(os.environ['RKNN_BLOCK_LOG'], 'a') as f:
                f.write(name + '\\n')
            raise ImportError(name + ' is unimportable in the %s process')
        return None
sys.meta_path.insert(0, _Blocked())
""" % (tuple(blocked), party)


#: ``-c`` source running ``rknn-ray`` with the blocked packages unimportable
RUN_CLI = "from jobs.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def party_command(python: str, blocked: tuple, party: str, args: list[str]) -> list[str]:
    """The argv that runs ``rknn-ray ARGS`` as ``party``, ``blocked`` unimportable."""
    return [python, "-c", block_finder(blocked, party) + RUN_CLI, *args]
