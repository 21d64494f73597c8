"""Actor -> rollout weight transfer. Embedded backends pass bucketed tensors through Ray's object
store (the rollout fetches them directly from the actor's node, never through the driver)."""

from __future__ import annotations


def sync_weights(roles, bucket_mb: int) -> None:
    buckets_ref = roles.actor.call_async("export_weights", bucket_mb * 1024 * 1024)[0]
    # An ObjectRef passed as an argument is resolved by Ray inside the rollout worker.
    roles.rollout.call("update_weights", buckets_ref)
