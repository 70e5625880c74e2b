"""``ast.parse`` for the tests that read the project's source, robust to a CPython 3.11 race.

CPython 3.11 keeps the AST converter's recursion depth in state shared by the interpreter's
threads (python/cpython#106905): a parse in the test's thread while another thread of the
same process parses too (a library thread a previous test left running in the xdist worker)
can fail with "SystemError: AST constructor recursion depth mismatch" (one CI run in the
fourth session). The parse is pure, so a failed one is simply done again.
"""
import ast

ATTEMPTS = 5


def parse(source: str) -> ast.Module:
    for attempt in range(ATTEMPTS):
        try:
            return ast.parse(source)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc) or attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")
