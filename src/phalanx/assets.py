"""The files Phalanx ships beside its code: the CRDs, the Helm chart and the example TrainingJobs.

They are package data (crds/, charts/ and examples/ install as phalanx.crds, phalanx.charts and
phalanx.examples), so the commands find them in the installed package, a wheel or an editable install alike,
never by looking for a repository.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from phalanx.errors import UserFacingError


def _installed(*parts: str) -> Path:
    # kubectl and Helm read these from disk: they must be plain files (a zipped install has none).
    path = Path(str(resources.files("phalanx").joinpath(*parts)))
    if not path.exists():
        raise UserFacingError(
            f"{'/'.join(parts)} is missing from the installed phalanx package ({path}): reinstall Phalanx"
        )
    return path


def crds_dir() -> Path:
    """The folder of the CustomResourceDefinitions Phalanx needs (TrainingJob, kopf's peering)."""
    return _installed("crds")


def chart_dir() -> Path:
    """The operator's Helm chart: in an editable install, the checkout's own folder, not the install's tree of
    links to its files (Helm warns about every link it follows)."""
    chart = _installed("charts", "phalanx")
    source = (chart / "Chart.yaml").resolve().parent
    return source if source != chart and (source / "templates").is_dir() else chart


def example(name: str) -> Path:
    """An example manifest (`tinygpt.yaml`, `tinygpt-elastic-topology.yaml`)."""
    return _installed("examples", name)
