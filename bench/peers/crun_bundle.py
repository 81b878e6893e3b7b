#!/usr/bin/env python3
"""Writes an OCI bundle for crun that runs /bin/true with the host's / as a read-only root,
its own pid/net/ipc/uts/mount namespaces and a memory + pids cgroup limit: the closest crun
equivalent of a DSec sandbox on the host image. Usage: crun_bundle.py DIR"""
import json
import os
import subprocess
import sys

bundle = sys.argv[1]
os.makedirs(bundle, exist_ok=True)
subprocess.run(["crun", "spec"], cwd=bundle, check=True)
path = os.path.join(bundle, "config.json")
with open(path) as f:
    spec = json.load(f)
# bench/run bind-mounts the host's / on rootfs inside a private mount namespace (crun cannot
# pivot_root into the current root itself).
os.makedirs(os.path.join(bundle, "rootfs"), exist_ok=True)
spec["root"] = {"path": "rootfs", "readonly": True}
spec["process"]["args"] = ["/bin/true"]
spec["process"]["terminal"] = False
spec["linux"]["resources"] = {"memory": {"limit": 512 << 20}, "pids": {"limit": 256},
                              "cpu": {"quota": 100000, "period": 100000}}
# The default spec mounts sysfs and a cgroup tree too; keep them (that is what crun does).
with open(path, "w") as f:
    json.dump(spec, f, indent=1)
