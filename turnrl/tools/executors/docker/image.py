"""The docker executor's default image, built locally from Debian packages (no image registry).

``build_image`` makes ``turnrl-sandbox:bookworm`` (``DEFAULT_IMAGE``): a Debian root
filesystem from ``debootstrap --variant=minbase --include=python3`` (apt's package lists and
downloaded ``.deb`` files removed), imported with ``docker import``. Only a Debian mirror is
needed, so it works where no image registry can be reached. The root filesystem is kept as a
tarball in a cache folder (``~/.cache/turnrl/docker``): a second build, on this engine or a new
one, only imports it (seconds); an image already on the engine is left alone unless ``force``.

``python -m turnrl build-docker-image`` is its command line; ``scripts/docker_engine.sh`` also
installs and starts an engine first (what CI runs).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_IMAGE", "DEFAULT_MIRROR", "DEFAULT_SUITE", "ImageBuildError", "build_image", "cache_dir",
           "rootfs_tarball"]

DEFAULT_IMAGE = "turnrl-sandbox:bookworm"
"""The docker executor's default image: built here by ``build_image``, never pulled."""
DEFAULT_SUITE = "bookworm"
"""Debian release of the image (its ``python3`` is 3.11)."""
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3",)
"""Packages every image holds: the executor's launcher runs with ``python3``."""
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUILD_HINT = "python -m turnrl build-docker-image"


class ImageBuildError(RuntimeError):
    """The image could not be built; the message says what is missing and how to get it."""


def cache_dir() -> Path:
    """Where root filesystem tarballs are kept: ``$XDG_CACHE_HOME/turnrl/docker`` (default ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "turnrl" / "docker"


def rootfs_tarball(suite: str = DEFAULT_SUITE, packages: Sequence[str] = (), *, mirror: str = DEFAULT_MIRROR,
                   cache: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """The cached tarball of a minbase Debian ``suite`` with ``python3`` and ``packages``,
    made with debootstrap (as root) when it is not in ``cache`` yet.

    Raises:
        ImageBuildError: If debootstrap is missing, this is not root, or debootstrap failed
            (the message holds the end of its log).
    """
    include = sorted(set(BASE_PACKAGES) | set(packages))
    recipe = f"{suite} minbase {','.join(include)}"
    cache = cache or cache_dir()
    tarball = cache / f"rootfs-{suite}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}.tar"
    if tarball.is_file():
        log(f"using the cached root filesystem {tarball} ({recipe})")
        return tarball
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed: run 'apt-get install debootstrap' (Debian/Ubuntu), "
                              "or use scripts/docker_engine.sh, which installs it")
    if os.geteuid() != 0:
        raise ImageBuildError(f"debootstrap must run as root: run 'sudo {BUILD_HINT}'")
    cache.mkdir(parents=True, exist_ok=True)
    log(f"debootstrap {recipe} from {mirror} (about a minute) ...")
    with tempfile.TemporaryDirectory(prefix="turnrl-rootfs-", dir=cache, ignore_cleanup_errors=True) as tmp:
        root = Path(tmp) / "root"
        done = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(include)}", suite,
                               str(root), mirror], capture_output=True, text=True)
        if done.returncode != 0:
            raise ImageBuildError(f"debootstrap {suite} from {mirror} failed (exit {done.returncode}); is the "
                                  f"mirror reachable? (--mirror URL picks another). Its output ends:\n"
                                  f"{(done.stdout + done.stderr)[-3000:]}")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):  # downloads and indexes: 90 MB
            for path in (root / junk).glob("*"):
                if path.is_file():
                    path.unlink()
        partial = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(partial), "."], check=True)
        partial.replace(tarball)  # atomic: a killed build leaves no half tarball in the cache
    return tarball


def build_image(client: Any, image: str = DEFAULT_IMAGE, *, suite: str = DEFAULT_SUITE, packages: Sequence[str] = (),
                mirror: str = DEFAULT_MIRROR, cache: Path | None = None, force: bool = False,
                log: Callable[[str], None] = print) -> bool:
    """Give ``client``'s engine the image ``image``: a minbase Debian ``suite`` with ``python3``
    (and ``packages``), from the cached tarball (``rootfs_tarball``).

    Args:
        client: A ``docker.DockerClient`` whose engine answers.
        image: ``name:tag`` to create (default ``DEFAULT_IMAGE``, the executor's default).
        suite, packages, mirror, cache: What ``rootfs_tarball`` builds, and where it is kept.
        force: Build and import even if the engine already has ``image``.
        log: Where progress lines go.

    Returns:
        True if the image was imported, False if the engine had it already.

    Raises:
        ImageBuildError: If the root filesystem cannot be built or the engine refuses the import.
    """
    import docker.errors
    from docker.utils import parse_repository_tag

    repository, tag = parse_repository_tag(image)
    if not force:
        try:
            client.images.get(image)
            log(f"{image} is already on the engine (--force rebuilds it)")
            return False
        except docker.errors.ImageNotFound:
            pass
    tarball = rootfs_tarball(suite, packages, mirror=mirror, cache=cache, log=log)
    changes = [f"ENV PATH={IMAGE_PATH}", "ENV LANG=C.UTF-8", 'CMD ["python3"]',
               f"LABEL turnrl.recipe={tarball.name}"]
    try:
        client.api.import_image_from_file(str(tarball), repository=repository, tag=tag or "latest", changes=changes)
        client.images.get(image)
    except docker.errors.DockerException as e:
        raise ImageBuildError(f"the engine did not import {tarball} as {image}: {e}") from None
    log(f"built {image} from {tarball}")
    return True
