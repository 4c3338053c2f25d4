"""Build dist/leadsvc.pyz: leadsvc, its pure-Python dependencies and db/migrations in one zipapp.

    python tools/build_pyz.py [--output dist/leadsvc.pyz]     (what `make dist` runs)

The dependencies are pyproject.toml's, plus the redis client (for shared rate limits), installed
with pip into build/pyz. Nothing compiled can load from inside a zip, so compiled files are left
out: markupsafe and wrapt ship optional C speedups and fall back to their Python code, and
psycopg's binary build cannot go in at all. The .pyz therefore runs on SQLite with any Python
3.11+, and on PostgreSQL when the Python that runs it can import psycopg (pip install
"psycopg[binary]" into that Python). Runs with the standard library only.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
import tomllib
import zipapp
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "pyz"
EXTRAS = ("redis",)                        # optional-dependencies that are pure Python
COMPILED = ("*.so", "*.pyd", "*.dylib")
LEFT_OUT = ("bin", "*-stubs", "pwiz.py")   # console scripts and type stubs: not needed at run time


def requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in EXTRAS:
        wanted += project["optional-dependencies"][extra]
    return wanted


def build(output: Path) -> Path:
    started = time.monotonic()
    shutil.rmtree(BUILD, ignore_errors=True)
    BUILD.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-compile", "--target", str(BUILD), *requirements()], check=True)
    for pattern in COMPILED + LEFT_OUT:
        for path in list(BUILD.glob(pattern)) + list(BUILD.glob(f"*/**/{pattern}")):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "leadsvc", BUILD / "leadsvc", ignore=ignore)
    # Beside the package, where db.migrations_dir() looks: resources.files("leadsvc").parent / "db".
    shutil.copytree(ROOT / "db" / "migrations", BUILD / "db" / "migrations", ignore=ignore)
    # Bytecode beside each module (zipimport cannot write a cache): a Python of the same version
    # starts without compiling; any other version ignores the .pyc files and compiles the source.
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-b", "--invalidation-mode", "unchecked-hash",
                    str(BUILD)], check=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    zipapp.create_archive(BUILD, output, interpreter="/usr/bin/env python3", main="leadsvc.cli:main",
                          compressed=True)
    print(f"{output.relative_to(ROOT) if output.is_relative_to(ROOT) else output}: "
          f"{output.stat().st_size / 1_000_000:.1f} MB in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return output


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "dist" / "leadsvc.pyz")
    build(parser.parse_args().output.resolve())
