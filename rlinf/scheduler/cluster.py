"""Connect to a running Ray cluster, or start a local one sized to this machine."""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_HEAD_IP_FILE = Path(__file__).resolve().parents[2] / "ray_utils" / "ray_head_ip.txt"
DEFAULT_RAY_PORT = 6379
MPS_ENV_KEYS = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


def cluster_address() -> str | None:
    """RAY_ADDRESS if set, else the head address ray_utils/start_ray.sh wrote, else None (start local)."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    head_file = Path(os.environ.get("RAY_HEAD_IP_FILE", DEFAULT_HEAD_IP_FILE))
    if head_file.is_file():
        ip = head_file.read_text().strip()
        if ip:
            return f"{ip}:{os.environ.get('RAY_PORT', DEFAULT_RAY_PORT)}"
    return None


def init_ray(num_gpus: int) -> bool:
    """Returns True when this call started or joined Ray (and so should shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    # Workers import rlinf from this checkout whether or not it is pip-installed.
    env_vars = {"PYTHONPATH": _pythonpath(), "TOKENIZERS_PARALLELISM": "false"}
    # the run's MPS daemon (rlinf.scheduler.mps), for the workers' CUDA contexts
    env_vars |= {key: os.environ[key] for key in MPS_ENV_KEYS if key in os.environ}
    runtime_env = {"env_vars": env_vars}
    address = cluster_address()
    if address:
        logger.info("connecting to Ray cluster at %s", address)
        # `ray start` enables token auth and writes this file; a client given an explicit address
        # would otherwise connect without the token and be refused.
        if (Path.home() / ".ray" / "auth_token").is_file():
            os.environ.setdefault("RAY_AUTH_MODE", "token")
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
        return True
    logger.info("starting a local Ray cluster (%d CPUs, %d GPUs)", os.cpu_count() or 1, num_gpus)
    ray.init(
        address="local",  # a fresh cluster: never attach to a stale one `ray start` left behind
        num_cpus=os.cpu_count() or 1,
        num_gpus=num_gpus,
        include_dashboard=False,
        runtime_env=runtime_env,
        log_to_driver=True,
    )
    return True


def _pythonpath() -> str:
    root = str(Path(__file__).resolve().parents[2])
    existing = os.environ.get("PYTHONPATH", "")
    return f"{root}:{existing}" if existing else root


def shutdown_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
