// The unmodified E2B JS SDKs (e2b and @e2b/code-interpreter, pinned in package-lock.json)
// against dsec-edge's E2B listener.
// Run by tests/integration/test_e2b.py with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set to
// the edge's listener and token; prints "ok <step>" per step and exits non-zero on a failure.
import assert from "node:assert/strict";
import { Sandbox, CommandExitError, TimeoutError, FileNotFoundError, NotFoundError } from "e2b";
import { Sandbox as CodeSandbox } from "@e2b/code-interpreter";

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
  // E2B's root is the sandbox's root for files too; its default user may not write there.
  await sbx.files.write("/etc/e2b-root.txt", "as root", { user: "root" });
  assert.equal(await sbx.files.read("/etc/e2b-root.txt", { user: "root" }), "as root");
  const owner = await sbx.commands.run("stat -c %U /etc/e2b-root.txt");
  assert.equal(owner.stdout.trim(), "root");
  await assert.rejects(sbx.files.write("/etc/e2b-user.txt", "x"));
  assert.equal(await sbx.files.makeDir("/etc/e2b-dir", { user: "root" }), true);
  await sbx.files.remove("/etc/e2b-dir", { user: "root" });
  assert.equal(await sbx.files.exists("/etc/e2b-dir"), false);
});

step("files.watchDir", async () => {
  await sbx.files.makeDir("/home/user/w");
  const events = [];
  const h = await sbx.files.watchDir("/home/user/w", (ev) => events.push(`${ev.type} ${ev.name}`),
    { recursive: true });
  await sbx.files.write("/home/user/w/a.txt", "1");
  await sbx.files.makeDir("/home/user/w/sub");
  await sbx.commands.run("sleep 0.3; cd /home/user/w && echo x > sub/b.txt && mv a.txt c.txt && " +
    "chmod 600 c.txt && rm c.txt");
  const want = ["create a.txt", "write a.txt", "create sub", "create sub/b.txt", "write sub/b.txt",
    "rename a.txt", "create c.txt", "chmod c.txt", "remove c.txt"];
  for (let i = 0; i < 100 && !want.every((w) => events.includes(w)); i++)
    await new Promise((r) => setTimeout(r, 50));
  assert.deepEqual(want.filter((w) => !events.includes(w)), [], JSON.stringify(events));
  await h.stop();
  const n = events.length;
  await sbx.files.write("/home/user/w/after.txt", "2");
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(events.length, n, JSON.stringify(events.slice(n)));  // stopped
  // Not recursive, with entries.
  const flat = [];
  const h2 = await sbx.files.watchDir("/home/user/w", (ev) => flat.push(ev), { includeEntry: true });
  await sbx.files.write("/home/user/w/sub/deep.txt", "3");
  await sbx.files.write("/home/user/w/top.txt", "four");
  for (let i = 0; i < 100 && !flat.some((e) => e.name === "top.txt" && e.type === "write"); i++)
    await new Promise((r) => setTimeout(r, 50));
  await h2.stop();
  assert.ok(!flat.some((e) => e.name.includes("deep")), JSON.stringify(flat));
  const top = flat.find((e) => e.name === "top.txt" && e.type === "write");
  assert.ok(top && top.entry && top.entry.path === "/home/user/w/top.txt", JSON.stringify(flat));
  await assert.rejects(sbx.files.watchDir("/home/user/nope", () => {}),
    (e) => e instanceof NotFoundError || e instanceof FileNotFoundError, "missing dir");
});

step("runCode: values, output, errors, state", async () => {
  const ci = await CodeSandbox.create({ metadata: { suite: tag, kind: "code" } });
  try {
    let ex = await ci.runCode("x = 41\nprint('hi')\nx + 1");
    assert.equal(ex.error, undefined, JSON.stringify(ex.error));
    assert.equal(ex.text, "42");
    assert.deepEqual(ex.logs.stdout, ["hi\n"]);
    assert.equal(ex.executionCount, 1);
    ex = await ci.runCode("x * 2");  // the kernel keeps its variables
    assert.equal(ex.text, "82");
    ex = await ci.runCode("'a string'");
    assert.equal(ex.text, "a string");
    ex = await ci.runCode("def f():\n    return 1 / 0\nf()");
    assert.equal(ex.error.name, "ZeroDivisionError");
    assert.equal(ex.error.value, "division by zero");
    assert.match(ex.error.traceback, /line 2, in f/);
    ex = await ci.runCode("def broken(:");
    assert.equal(ex.error.name, "SyntaxError");
    // Output arrives while the code runs, stdout and stderr apart, children's too.
    const out = [], err = [];
    const t0 = Date.now();
    ex = await ci.runCode(
      "import subprocess, sys, time\n" +
      "for i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)\n" +
      "print('warn', file=sys.stderr)\n" +
      "subprocess.run(['sh', '-c', 'echo child; id -u'])",
      { onStdout: (m) => out.push([m.line, Date.now() - t0]), onStderr: (m) => err.push(m.line) });
    assert.equal(ex.error, undefined, JSON.stringify(ex.error));
    assert.match(ex.logs.stdout.join(""), /^0\n1\n2\nchild\n[1-9][0-9]*\n$/);  // not root
    assert.deepEqual(err, ["warn\n"]);
    assert.ok(out[0][1] < out[2][1] - 300, JSON.stringify(out));  // streamed, not at the end
    ex = await ci.runCode("import os; os.environ['GREETING']", { envs: { GREETING: "hello" } });
    assert.equal(ex.text, "hello");
    ex = await ci.runCode("import os; os.environ.get('GREETING')");
    assert.equal(ex.text, undefined);  // per execution only: None is no result
    ex = await ci.runCode("class H:\n    def _repr_html_(self):\n        return '<b>x</b>'\nH()");
    assert.equal(ex.results[0].html, "<b>x</b>");
    ex = await ci.runCode("import os; (os.getcwd(), os.getuid() != 0)");
    assert.equal(ex.text, "('/home/user', True)");
    // A client timeout interrupts the execution; the kernel and its state stay.
    await assert.rejects(ci.runCode("import time\ntime.sleep(60)", { timeoutMs: 1000 }),
      (e) => e instanceof TimeoutError);
    ex = await ci.runCode("x");
    assert.equal(ex.text, "41");
    // A kernel that dies ends its execution with an error; the next call gets a fresh one.
    ex = await ci.runCode("import os; os._exit(3)");
    assert.equal(ex.error.name, "DeadKernelError");
    ex = await ci.runCode("'x' in dir()");
    assert.equal(ex.text, "False");
  } finally {
    await ci.kill();
  }
});

step("code contexts", async () => {
  const ci = await CodeSandbox.create({ metadata: { suite: tag, kind: "code" } });
  try {
    const ctx = await ci.createCodeContext({ cwd: "/tmp" });
    assert.equal(ctx.cwd, "/tmp");
    assert.equal(ctx.language, "python");
    let ex = await ci.runCode("import os; y = 7; os.getcwd()", { context: ctx });
    assert.equal(ex.text, "/tmp");
    ex = await ci.runCode("'y' in dir()");  // the default context is another kernel
    assert.equal(ex.text, "False");
    const listed = await ci.listCodeContexts();
    assert.deepEqual(listed.map((c) => c.id), [ctx.id]);
    await ci.restartCodeContext(ctx);
    ex = await ci.runCode("'y' in dir()", { context: ctx });
    assert.equal(ex.text, "False");
    await ci.removeCodeContext(ctx);
    assert.deepEqual(await ci.listCodeContexts(), []);
    await assert.rejects(ci.runCode("1", { context: ctx }), (e) => e instanceof NotFoundError);
    // Several contexts run at once.
    const ctxs = await Promise.all([1, 2, 3].map(() => ci.createCodeContext()));
    const t0 = Date.now();
    const res = await Promise.all(ctxs.map((c, i) =>
      ci.runCode(`import time\ntime.sleep(1)\n${i} * 10`, { context: c })));
    assert.deepEqual(res.map((r) => r.text), ["0", "10", "20"]);
    assert.ok(Date.now() - t0 < 2900, `${Date.now() - t0} ms`);
  } finally {
    await ci.kill();
  }
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
