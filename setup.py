"""Build hooks (the rest of the configuration is in pyproject.toml): ship the `accelerate` alias's
startup hook, a `.pth` file at the root of site-packages, in the wheel and in editable installs.

With CADENCE_AS_ACCELERATE unset the hook's one line reads a variable and imports nothing."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools < 64 has no PEP 660 editable installs
    editable_wheel = None

# Sorted after setuptools' "__editable__.*.pth", so that an editable install's path is set first.
PTH_NAME = "cadence_as_accelerate.pth"
PTH_LINE = (
    "import os; "
    'os.environ.get("CADENCE_AS_ACCELERATE", "").strip().lower() in ("1", "true", "yes", "on") '
    'and __import__("cadence.alias.startup")\n'
)


def _write_pth(folder: str) -> str:
    path = Path(folder, PTH_NAME)
    path.write_text(PTH_LINE, encoding="utf-8")
    return str(path)


class BuildPyWithPth(build_py):
    """build_py that also puts the startup hook at the root of the build folder (the wheel's purelib)."""

    def run(self) -> None:
        super().run()
        if not getattr(self, "editable_mode", False):
            self.mkpath(self.build_lib)
            _write_pth(self.build_lib)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outputs
        return [*outputs, str(Path(self.build_lib, PTH_NAME))]


cmdclass = {"build_py": BuildPyWithPth}

if editable_wheel is not None:

    class EditableWheelWithPth(editable_wheel):
        """editable_wheel that adds the startup hook to the files the editable wheel installs."""

        def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):  # noqa: ANN001
            result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
            _write_pth(str(unpacked_wheel))  # the unpacked folder's files all go into the wheel
            return result

    cmdclass["editable_wheel"] = EditableWheelWithPth

setup(cmdclass=cmdclass)
