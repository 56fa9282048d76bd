"""The project installs beside a current CUDA jax: its declared jax range admits the releases
GPU machines carry and excludes only the one measured broken, and nothing it pulls in
requires another jax."""

import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
GPU_JAX = "0.11.2"  # what ran on the GPU (docs/results/gpu_experiments*.json)


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _declared() -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r
            for r in map(Requirement, _project()["dependencies"])}


def test_jax_range_admits_ci_and_current_releases_and_excludes_the_hanging_series():
    declared = _declared()
    for name in ("jax", "jaxlib"):
        specifier = declared[name].specifier
        for version in ("0.9.2", GPU_JAX, "0.12.0"):
            assert specifier.contains(version), f"{name} {specifier} rejects {version}"
        # under jax 0.10.2 a vmapped PPO over three agents never returns (tests/_hang_guard.py)
        for version in ("0.10.0", "0.10.1", "0.10.2"):
            assert not specifier.contains(version), f"{name} {specifier} admits {version}"


def test_ci_installs_versions_inside_every_declared_range():
    declared = _declared()
    pinned = {}
    for line in (ROOT / ".ci" / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pinned[canonicalize_name(name)] = version
    for name, requirement in declared.items():
        if name in pinned:
            assert requirement.specifier.contains(pinned[name], prereleases=True), (
                f"CI installs {name}=={pinned[name]}, outside the declared {requirement}")


def _closure() -> dict[str, set[str]]:
    """Every installed distribution the project pulls in, with all its extras: name -> the
    extras asked of it (walked through the installed metadata)."""
    project = _project()
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra in project.get("optional-dependencies", {}).values():
        wanted += [Requirement(r) for r in extra]
    seen: dict[str, set[str]] = {}
    while wanted:
        requirement = wanted.pop()
        name = canonicalize_name(requirement.name)
        extras = set(requirement.extras)
        if name in seen and extras <= seen[name]:
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue  # an extra's package that is not installed here
        seen[name] = seen.get(name, set()) | extras
        for text in dist.requires or []:
            inner = Requirement(text)
            if inner.marker is None or any(
                    inner.marker.evaluate({"extra": extra}) for extra in {"", *seen[name]}):
                wanted.append(inner)
    return seen


def test_no_installed_dependency_requires_a_jax_other_than_the_gpu_one():
    closure = _closure()
    assert {"flax", "optax", "orbax-checkpoint", "evosax", "gymnax", "brax",
            "mujoco-mjx", "chex"} <= set(closure)
    refusals = []
    for name, extras in sorted(closure.items()):
        if name in ("jax", "jaxlib"):  # the GPU machine's own, with their own pins
            continue
        for text in distribution(name).requires or []:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) not in ("jax", "jaxlib"):
                continue
            if requirement.marker is not None and not any(
                    requirement.marker.evaluate({"extra": extra}) for extra in {"", *extras}):
                continue
            if not requirement.specifier.contains(GPU_JAX):
                refusals.append(f"{name} {distribution(name).version} requires {text}")
    assert not refusals, "installing beside jax 0.11.2 would change jax: " + "; ".join(refusals)
