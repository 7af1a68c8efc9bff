"""The deployment layer: compile an environment into a Compose project on disk, bring it up
with a per-project python-on-whales client, find our projects by label, take them down, and
reap the ones whose owner is gone. Knows nothing of how commands run."""

from orchestrator.project.engine import docker_client, docker_errors, wrap
from orchestrator.project.identity import (
    DEFAULT_POOL,
    DEFAULT_PREFIX,
    DETACHED,
    LABEL_DIGEST,
    LABEL_DIR,
    LABEL_ENV,
    LABEL_MANAGED,
    LABEL_PROJECT,
    POOL_ENV,
    PREFIX_ENV,
    owner_alive,
    pick_subnet,
    state_dir,
)
from orchestrator.project.inventory import (
    ProjectInfo,
    ProjectStatus,
    claim_from_pool,
    find_project,
    list_projects,
    match_project,
    project_statuses,
    reap,
    remove_by_label,
    remove_project,
)
from orchestrator.project.lifecycle import Project, start_project

__all__ = [
    "DEFAULT_POOL",
    "DEFAULT_PREFIX",
    "DETACHED",
    "LABEL_DIGEST",
    "LABEL_DIR",
    "LABEL_ENV",
    "LABEL_MANAGED",
    "LABEL_PROJECT",
    "POOL_ENV",
    "PREFIX_ENV",
    "Project",
    "ProjectInfo",
    "ProjectStatus",
    "claim_from_pool",
    "docker_client",
    "docker_errors",
    "find_project",
    "list_projects",
    "match_project",
    "owner_alive",
    "pick_subnet",
    "project_statuses",
    "reap",
    "remove_by_label",
    "remove_project",
    "start_project",
    "state_dir",
    "wrap",
]
