"""A public namespace's exported name and a submodule of the same name: the reference's
`accelerate.utils.tqdm` is the function, and `accelerate/utils/tqdm.py` a module too. Importing the
submodule must not rebind the namespace's name to the module (Python's import system sets the parent's
attribute after loading a submodule), so each case runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = {
    "submodule imported first": "import cadence.utils.tqdm\nfrom cadence.utils import tqdm",
    "name used first": "from cadence.utils import tqdm\nimport cadence.utils.tqdm",
    "from-import of the submodule's name": "from cadence.utils.tqdm import tqdm as inner\n"
    "import cadence.utils\ntqdm = cadence.utils.tqdm\nassert inner is tqdm",
}


@pytest.mark.parametrize("case", list(CASES))
def test_utils_tqdm_stays_the_function(case: str) -> None:
    script = (
        CASES[case]
        + "\nimport sys, types, cadence.utils\n"
        + "assert callable(tqdm) and not isinstance(tqdm, types.ModuleType), tqdm\n"
        + "assert cadence.utils.tqdm is tqdm\n"
        + "assert isinstance(sys.modules['cadence.utils.tqdm'], types.ModuleType)\n"
        + "assert sys.modules['cadence.utils.tqdm'].tqdm is tqdm\n"
        + "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
