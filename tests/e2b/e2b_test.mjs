// The unmodified E2B JS SDK (e2b, pinned in package-lock.json) against dsec-edge's E2B listener.
// Run by tests/integration/test_e2b.py with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set to
// the edge's listener and token; prints "ok <step>" per step and exits non-zero on a failure.
import assert from "node:assert/strict";
import { Sandbox, CommandExitError, TimeoutError, FileNotFoundError } from "e2b";

const steps = [];
const step = (name, fn) => steps.push([name, fn]);
const tag = `it-${process.pid}-${Date.now()}`;
let sbx;

step("create with metadata", async () => {
  sbx = await Sandbox.create({ metadata: { suite: tag, kind: "main" }, timeoutMs: 120_000 });
  assert.match(sbx.sandboxId, /^sb-/);
  const info = await sbx.getInfo();
  assert.equal(info.sandboxId, sbx.sandboxId);
  assert.equal(info.metadata.suite, tag);
  assert.equal(info.state, "running");
  assert.equal(info.templateId, "base");
  assert.ok(await sbx.isRunning());
});

step("commands.run with onStdout/onStderr", async () => {
  const out = [], err = [];
  const r = await sbx.commands.run("echo hello; echo oops >&2; echo $HOME; pwd; whoami", {
    onStdout: (d) => out.push(d), onStderr: (d) => err.push(d),
  });
  assert.equal(r.exitCode, 0);
  assert.deepEqual(r.stdout.split("\n").slice(0, 3), ["hello", "/home/user", "/home/user"]);
  assert.equal(r.stderr, "oops\n");
  assert.equal(out.join(""), r.stdout);
  assert.equal(err.join(""), "oops\n");
  const root = await sbx.commands.run("id -u", { user: "root" });
  assert.equal(root.stdout.trim(), "0");
  const env = await sbx.commands.run("echo $A-$B", { envs: { A: "1", B: "two" }, cwd: "/tmp" });
  assert.equal(env.stdout, "1-two\n");
});

step("exit codes", async () => {
  await assert.rejects(sbx.commands.run("echo partial; exit 3"), (e) => {
    assert.ok(e instanceof CommandExitError, String(e));
    assert.equal(e.exitCode, 3);
    assert.equal(e.stdout, "partial\n");
    return true;
  });
});

step("timeouts", async () => {
  const t0 = Date.now();
  await assert.rejects(sbx.commands.run("sleep 30", { timeoutMs: 1000 }), (e) => {
    assert.ok(e instanceof TimeoutError, String(e));
    return true;
  });
  assert.ok(Date.now() - t0 < 15_000);
});

step("background command, then kill", async () => {
  const h = await sbx.commands.run("sleep 300", { background: true });
  assert.ok(h.pid > 0);
  const listed = await sbx.commands.list();
  assert.ok(listed.some((p) => p.pid === h.pid), JSON.stringify(listed));
  assert.equal(await h.kill(), true);
  await assert.rejects(h.wait(), (e) => e instanceof CommandExitError && e.exitCode === -1);
  assert.equal(await sbx.commands.kill(h.pid), false);  // gone now
});

step("stdin", async () => {
  const h = await sbx.commands.run("cat; echo done", { background: true, stdin: true });
  await sbx.commands.sendStdin(h.pid, "abc\n");
  await h.closeStdin();
  const r = await h.wait();
  assert.equal(r.stdout, "abc\ndone\n");
});

step("files", async () => {
  const w = await sbx.files.write("/home/user/dir/a.txt", "hello file");
  assert.equal(w.path, "/home/user/dir/a.txt");
  assert.equal(await sbx.files.read("/home/user/dir/a.txt"), "hello file");
  await sbx.files.write("rel.txt", "relative");  // relative to the user's home
  assert.equal(await sbx.files.read("/home/user/rel.txt"), "relative");
  const many = await sbx.files.write([{ path: "m/1.txt", data: "one" }, { path: "/tmp/2.txt", data: "two" }]);
  assert.equal(many.length, 2);
  assert.equal(await sbx.files.read("/tmp/2.txt"), "two");
  assert.equal(await sbx.files.makeDir("/home/user/newdir/sub"), true);
  assert.equal(await sbx.files.makeDir("/home/user/newdir/sub"), false);  // exists
  const list = await sbx.files.list("/home/user/dir");
  assert.deepEqual(list.map((e) => [e.name, e.type]), [["a.txt", "file"]]);
  assert.equal(list[0].size, 10);
  const moved = await sbx.files.rename("/home/user/dir/a.txt", "/home/user/moved/b.txt");
  assert.equal(moved.path, "/home/user/moved/b.txt");
  assert.equal(await sbx.files.exists("/home/user/dir/a.txt"), false);
  assert.equal(await sbx.files.exists("/home/user/moved/b.txt"), true);
  const info = await sbx.files.getInfo("/home/user/moved/b.txt");
  assert.equal(info.type, "file");
  await sbx.files.remove("/home/user/moved");
  assert.equal(await sbx.files.exists("/home/user/moved"), false);
  await assert.rejects(sbx.files.read("/home/user/nope.txt"), (e) => e instanceof FileNotFoundError);
  const bin = new Uint8Array(256).map((_, i) => i);
  await sbx.files.write("/home/user/bin.dat", bin.buffer);
  const back = await sbx.files.read("/home/user/bin.dat", { format: "bytes" });
  assert.deepEqual(Array.from(back), Array.from(bin));
  // A command sees what the files API wrote, as E2B's user.
  const r = await sbx.commands.run("stat -c '%U %s' /home/user/bin.dat");
  assert.match(r.stdout, / 256\n$/);
});

step("list with a metadata filter", async () => {
  const other = await Sandbox.create({ metadata: { suite: tag, kind: "other" } });
  try {
    const p = Sandbox.list({ query: { metadata: { suite: tag, kind: "main" } } });
    const items = await p.nextItems();
    assert.deepEqual(items.map((s) => s.sandboxId), [sbx.sandboxId]);
    const all = await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems();
    assert.equal(all.length, 2);
  } finally {
    assert.equal(await other.kill(), true);
  }
});

step("setTimeout", async () => {
  const before = (await sbx.getInfo()).endAt.getTime();
  await sbx.setTimeout(600_000);
  const after = (await sbx.getInfo()).endAt.getTime();
  assert.ok(after > before + 300_000, `${before} -> ${after}`);
});

step("pause then connect", async () => {
  await sbx.files.write("/home/user/keep.txt", "kept");
  assert.equal(await sbx.pause(), true);
  assert.equal(await sbx.pause(), false);  // already paused
  assert.equal((await sbx.getInfo()).state, "paused");
  assert.equal(await sbx.isRunning(), false);
  const again = await Sandbox.connect(sbx.sandboxId);
  assert.equal((await again.getInfo()).state, "running");
  assert.equal(await again.files.read("/home/user/keep.txt"), "kept");
  const r = await again.commands.run("echo back");
  assert.equal(r.stdout, "back\n");
});

step("32 sandboxes at once", async () => {
  const made = await Promise.all(Array.from({ length: 32 }, (_, i) =>
    Sandbox.create({ metadata: { suite: tag, kind: "many" } }).then(async (s) => {
      const r = await s.commands.run(`echo ${i}`);
      assert.equal(r.stdout, `${i}\n`);
      return s;
    })));
  assert.equal(new Set(made.map((s) => s.sandboxId)).size, 32);
  const killed = await Promise.all(made.map((s) => s.kill()));
  assert.ok(killed.every((k) => k === true));
});

step("kill", async () => {
  assert.equal(await sbx.kill(), true);
  assert.equal(await Sandbox.kill(sbx.sandboxId), false);
  await assert.rejects(Sandbox.connect(sbx.sandboxId));
});

let failed = 0;
for (const [name, fn] of steps) {
  try {
    await fn();
    console.log(`ok ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
    if (name === "create with metadata") break;
  }
}
if (sbx) await Sandbox.kill(sbx.sandboxId).catch(() => {});
process.exit(failed ? 1 : 0);
