"""The WIT package of portwise membership checkers, for componentize-py.

    componentize-py -d "$(python -m portwise_guest)" -w membership-checker \
        componentize -p . checker -o my-checker.wasm

Build-time only: componentize-py bundles its own CPython, and the checker
itself imports the generated bindings (``wit_world``), not this package.
"""

from pathlib import Path

#: The WIT package this version carries.
WIT_PACKAGE = "portwise:membership@0.2.1"
#: The world a checker implements.
WORLD = "membership-checker"


def wit_dir() -> Path:
    """The directory holding membership.wit, for ``componentize-py -d``."""
    return Path(__file__).resolve().parent / "wit"
