"""The benchmarks' raw output: `JSON {...}` lines among other text (bench/run's raw file)."""
import json


def records(path):
    """Yields each parsed `JSON {...}` line of the file; other and malformed lines are skipped."""
    with open(path) as f:
        for line in f:
            if not line.startswith("JSON "):
                continue
            try:
                yield json.loads(line[5:])
            except ValueError:
                continue
