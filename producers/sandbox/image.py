"""The Docker sandbox's image: what it is built from and the name it is known by.

The image is built without a registry, from Debian packages (see `infra/sandbox_engine/`, which
builds it with `mmdebstrap` and `docker import`). Its tag is derived from the recipe, so a change to
the packages gives a new tag and an engine that holds the old image builds the new one once.
"""

from __future__ import annotations

import hashlib

__all__ = ["SANDBOX_IMAGE", "SANDBOX_IMAGE_REPOSITORY", "SANDBOX_PACKAGES", "SANDBOX_SUITE"]

SANDBOX_SUITE = "bookworm"
# python3 + pytest run the coding tasks' tests; git gives the diff the verdict is taken from;
# procps lets agents (and the escape suite) look at processes.
SANDBOX_PACKAGES = ("python3", "python3-pytest", "git", "procps")
RECIPE_VERSION = 1  # bump when the build steps change in a way the packages do not show
SANDBOX_IMAGE_REPOSITORY = "agentstream-sandbox"


def _tag() -> str:
    recipe = f"{RECIPE_VERSION}|{SANDBOX_SUITE}|{','.join(SANDBOX_PACKAGES)}"
    return f"{SANDBOX_SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


SANDBOX_IMAGE = f"{SANDBOX_IMAGE_REPOSITORY}:{_tag()}"
