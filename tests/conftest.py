import os

# Tests share the machine's 2 cores; keep torch from oversubscribing them.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
