"""What a benchmark needs from Debian, installed with apt when missing, or a clear error saying so."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys


def apt_install(package: str, install: bool, alternative: str = "") -> None:
    """apt-get install `package`; RuntimeError naming it when not wanted (`install` false) or not
    possible here (not root, no apt)."""
    hint = f"apt-get install {package}" + (f", or use {alternative}" if alternative else "")
    if not install:
        raise RuntimeError(f"{package} is not installed (--no-install): {hint}")
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise RuntimeError(f"{package} is not installed and cannot be installed here (needs root and apt): {hint}")
    print(f"installing {package} with apt-get ...", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "install", "-y", "-q", package], check=True, env=env, stdout=subprocess.DEVNULL)
