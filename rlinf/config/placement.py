"""Parse `cluster.component_placement` into GPU sets per role (pure; no Ray import)."""

from __future__ import annotations

from dataclasses import dataclass

from rlinf.config.typed import ConfigError

ROLES = ("actor", "rollout", "reward")


@dataclass(frozen=True)
class Placement:
    gpus: dict[str, tuple[int, ...]]  # role -> global GPU indices; () = CPU

    def is_colocated(self, a: str, b: str) -> bool:
        return bool(set(self.gpus[a]) & set(self.gpus[b]))


def parse_gpu_spec(spec: str, num_gpus: int, where: str) -> tuple[int, ...]:
    """'all' | '0-3' | '0,2,5' | '0-1,4-5' -> sorted GPU indices (empty when the cluster has none)."""
    spec = str(spec).strip()
    if spec == "all":
        return tuple(range(num_gpus))
    indices: set[int] = set()
    for part in spec.split(","):
        try:
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise ConfigError(
                f"{where}: cannot parse GPU range {spec!r} (use 'all', '0-3' or '0,2')"
            ) from None
        if first > last or first < 0:
            raise ConfigError(f"{where}: empty or negative GPU range {part!r}")
        indices.update(range(first, last + 1))
    beyond = sorted(i for i in indices if i >= num_gpus)
    if beyond:
        raise ConfigError(
            f"{where}: GPU(s) {beyond} requested but the cluster has {num_gpus} GPU(s) "
            f"(cluster.num_nodes x cluster.num_gpus_per_node)"
        )
    return tuple(sorted(indices))


def parse_placement(component_placement: dict[str, str], num_gpus: int) -> Placement:
    gpus: dict[str, tuple[int, ...]] = {}
    for roles, spec in component_placement.items():
        where = f"cluster.component_placement.{roles}"
        for role in (r.strip() for r in roles.split(",")):
            if role not in ROLES:
                raise ConfigError(f"{where}: unknown role {role!r} (roles: {', '.join(ROLES)})")
            if role in gpus:
                raise ConfigError(f"{where}: role {role!r} is placed twice")
            gpus[role] = parse_gpu_spec(spec, num_gpus, where)
    for role in ("actor", "rollout"):
        if role not in gpus:
            raise ConfigError(f"cluster.component_placement: role {role!r} is not placed")
    gpus.setdefault("reward", ())  # grading runs on CPU processes wherever it is placed
    return Placement(gpus)
