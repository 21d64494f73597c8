import os

# Tests share the machine's 2 cores; keep torch from oversubscribing them.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# One tiny-model build per test session, shared by every test that needs the bootstrapped model,
# and never the user's own cache.
if "RLINF_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["RLINF_CACHE_DIR"] = tempfile.mkdtemp(prefix="rlinf-test-cache-")
