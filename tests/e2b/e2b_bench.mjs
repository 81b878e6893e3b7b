// E2B commands.run('true') (which runs `/bin/bash -l -c true`) through dsec-edge's E2B
// listener, against a native POST /v1/sandboxes/{id}/exec of the same command from the same
// Node process (fetch, keep-alive), on one sandbox, interleaved in rounds; then the code
// interpreter's runCode('1 + 1') (a persistent kernel) against a native exec of
// `python3 -c 'print(1 + 1)'` (a fresh interpreter per call). Run by bench/e2b_bench.py;
// prints one JSON line per system.
import { Sandbox } from "e2b";
import { Sandbox as CodeSandbox } from "@e2b/code-interpreter";

const calls = Number(process.env.CALLS || 200);
const rounds = Number(process.env.ROUNDS || 3);
const native = process.env.DSEC_URL;
const token = process.env.E2B_API_KEY;

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

const sbx = await Sandbox.create({ metadata: { bench: "e2b" } });
const lat = { e2b: [], native: [], runcode: [], "native-python": [] };
try {
  const body = JSON.stringify({ cmd: ["/bin/bash", "-l", "-c", "true"] });
  const runNative = async () => {
    const r = await fetch(`${native}/v1/sandboxes/${sbx.sandboxId}/exec`, {
      method: "POST", body,
      headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    });
    const j = await r.json();
    if (r.status !== 200 || j.exit_code !== 0) throw new Error(JSON.stringify(j));
  };
  const runE2b = async () => {
    const r = await sbx.commands.run("true");
    if (r.exitCode !== 0) throw new Error(JSON.stringify(r));
  };
  for (let i = 0; i < 10; i++) { await runNative(); await runE2b(); }  // warm both paths
  for (let r = 0; r < rounds; r++) {
    for (const [name, fn] of [["native", runNative], ["e2b", runE2b]]) {
      for (let i = 0; i < calls; i++) {
        const t = performance.now();
        await fn();
        lat[name].push(performance.now() - t);
      }
    }
  }
} finally {
  await sbx.kill();
}
const ci = await CodeSandbox.create({ metadata: { bench: "e2b" } });
try {
  const body = JSON.stringify({ cmd: ["python3", "-c", "print(1 + 1)"] });
  const runNative = async () => {
    const r = await fetch(`${native}/v1/sandboxes/${ci.sandboxId}/exec`, {
      method: "POST", body,
      headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    });
    const j = await r.json();
    if (r.status !== 200 || j.stdout !== "2\n") throw new Error(JSON.stringify(j));
  };
  const runCode = async () => {
    const r = await ci.runCode("1 + 1");
    if (r.text !== "2") throw new Error(JSON.stringify(r));
  };
  for (let i = 0; i < 10; i++) { await runNative(); await runCode(); }
  for (let r = 0; r < rounds; r++) {
    for (const [name, fn] of [["native-python", runNative], ["runcode", runCode]]) {
      for (let i = 0; i < calls; i++) {
        const t = performance.now();
        await fn();
        lat[name].push(performance.now() - t);
      }
    }
  }
} finally {
  await ci.kill();
}
for (const name of ["native", "e2b", "native-python", "runcode"]) {
  const xs = lat[name];
  console.log(JSON.stringify({
    workload: name === "native" || name === "e2b" ? "bash -l -c true" : "python 1 + 1",
    system: name, n: xs.length,
    p50_ms: +pct(xs, 50).toFixed(3), p90_ms: +pct(xs, 90).toFixed(3),
    p99_ms: +pct(xs, 99).toFixed(3),
  }));
}
