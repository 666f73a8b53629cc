// @sandgate/sdk against a real gateway: run by test/sdk_test.go
// (TestTypeScriptSDK), which starts one and sets
//   SANDGATE_URL, SANDGATE_API_KEY  the gateway and a tenant's key
//   SANDGATE_TEST_PAGE              a page sessions can reach (title
//                                   "Sandgate test page", window.answer 42)
//   SANDGATE_TEST_LABEL             the label "test" of the sessions made
// Every refusal checked here has the same call succeeding beside it.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";

import { Sandgate, SandgateError } from "@sandgate/sdk";

const { SANDGATE_URL, SANDGATE_API_KEY, SANDGATE_TEST_PAGE, SANDGATE_TEST_LABEL } = process.env;
const skip = !SANDGATE_URL || !SANDGATE_API_KEY ? "needs a gateway: SANDGATE_URL and SANDGATE_API_KEY (test/sdk_test.go sets them)" : false;
const T = { timeout: 180_000 };

// rejects asserts that fn throws a SandgateError with this status and code.
async function rejects(fn, status, code) {
  await assert.rejects(fn, (err) => {
    assert.ok(err instanceof SandgateError, `want a SandgateError, got ${err}`);
    assert.equal(err.status, status, err.message);
    assert.equal(err.code, code, err.message);
    assert.ok(err.message.length > 0);
    return true;
  });
}

const sha256 = (b) => createHash("sha256").update(b).digest("hex");

// poll calls fn until it returns something truthy or the time is up.
async function poll(fn, ms = 15_000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v || Date.now() > end) return v;
    await new Promise((r) => setTimeout(r, 200));
  }
}

describe("@sandgate/sdk", { skip, concurrency: 1 }, () => {
  const sg = new Sandgate(); // from SANDGATE_URL and SANDGATE_API_KEY
  const label = { test: SANDGATE_TEST_LABEL || "sdk-" + randomBytes(4).toString("hex") };
  let browser; // the browser session most tests share
  const made = [];

  before(async () => {
    browser = await sg.sessions.create({ kind: "browser", ttl_seconds: 600, labels: label });
    made.push(browser.id);
  });
  after(async () => {
    for (const id of made) await sg.sessions.delete(id).catch(() => {});
  });

  test("create, get, list, extend a browser session", T, async () => {
    assert.match(browser.id, /^s-[0-9a-f]{16}$/);
    assert.equal(browser.kind, "browser");
    assert.equal(browser.state, "running");
    assert.deepEqual(browser.labels, label);

    const got = await sg.sessions.get(browser.id);
    assert.equal(got.id, browser.id);
    assert.equal(got.state, "running");
    const same = await sg.sessions.get(browser); // a session object does as well as its id
    assert.equal(same.id, browser.id);

    const list = await sg.sessions.list();
    assert.ok(Array.isArray(list));
    assert.ok(list.some((s) => s.id === browser.id), "the new session is listed");

    const longer = await sg.sessions.extend(browser, 1200);
    assert.ok(Date.parse(longer.expires_at) > Date.parse(browser.expires_at), `${longer.expires_at} after ${browser.expires_at}`);
  });

  test("runtimes and pools", T, async () => {
    const rt = await sg.runtimes();
    assert.ok(rt.runtimes.some((r) => r.name === browser.runtime && r.usable), JSON.stringify(rt));
    assert.equal(typeof rt.default, "string");
    assert.ok(Array.isArray(await sg.pools()));
  });

  test("usage counts the tenant's sessions; a bad wait_seconds is 400", T, async () => {
    const u = await sg.usage();
    assert.ok(u.sessions >= 1, JSON.stringify(u)); // the shared browser session
    assert.ok(u.memory_mb >= 512 && u.cpus > 0 && u.queued === 0, JSON.stringify(u));
    assert.equal(typeof u.max_sessions, "number");
    await rejects(() => sg.sessions.create({ wait_seconds: 601, labels: label }), 400, "invalid_argument");
    assert.equal((await sg.usage()).sessions, u.sessions, "a refused create holds nothing");
  });

  test("errors: a bad key is 401 unauthenticated, an unknown id 404 not_found", T, async () => {
    // The controls: the right key, an existing id.
    await sg.sessions.list();
    await sg.sessions.get(browser.id);

    const bad = new Sandgate({ baseURL: SANDGATE_URL, apiKey: "sg_not_a_key_" + randomBytes(8).toString("hex") });
    await rejects(() => bad.sessions.list(), 401, "unauthenticated");
    await rejects(() => bad.sessions.get(browser.id), 401, "unauthenticated");
    await rejects(() => sg.sessions.get("s-0000000000000000"), 404, "not_found");
    await rejects(() => sg.sessions.get("not-an-id"), 404, "not_found");
    await rejects(() => sg.previews.create("s-0000000000000000", { scope: "cdp" }), 404, "not_found");
    // A malformed request: the gateway's own 400 comes through.
    await rejects(() => sg.previews.create(browser, { scope: "bogus" }), 400, "invalid_argument");
  });

  test("exec streams output in order while the command runs, with its exit code", T, async () => {
    // The command prints, then waits for a file the test writes only once
    // it has read that output from the stream: it can only end if the
    // output came before the end.
    const flag = "/tmp/sdk-go-" + randomBytes(4).toString("hex");
    const script = `for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.1; done
while [ ! -e ${flag} ]; do sleep 0.05; done; echo after; exit 7`;
    const ex = await sg.exec(browser, { cmd: ["sh", "-c", script], timeout_seconds: 60 });
    const seen = [];
    const text = { stdout: "", stderr: "" };
    let exit;
    let released = false;
    for await (const f of ex) {
      if (f.stream === "exit") {
        exit = f;
        continue;
      }
      assert.ok(f.data instanceof Uint8Array);
      text[f.stream] += new TextDecoder().decode(f.data);
      for (const line of new TextDecoder().decode(f.data).split("\n").filter(Boolean)) seen.push(`${f.stream}:${line}`);
      if (!released && text.stdout.includes("out3") && text.stderr.includes("err3")) {
        released = true;
        await sg.files.put(browser, flag, "go");
      }
    }
    assert.ok(released, "the output before the wait arrived while the command ran");
    assert.deepEqual(seen, [
      "stdout:out1", "stderr:err1", "stdout:out2", "stderr:err2", "stdout:out3", "stderr:err3", "stdout:after",
    ]);
    assert.equal(exit.exit_code, 7);
    assert.equal(exit.timed_out, false);
    assert.ok(exit.duration_ms > 0);
  });

  test("run collects stdout, stderr and the exit code", T, async () => {
    const ok = await sg.run(browser, ["sh", "-c", "echo hello; echo oops >&2"]);
    assert.deepEqual({ ...ok, duration_ms: 0 }, { stdout: "hello\n", stderr: "oops\n", exit_code: 0, duration_ms: 0, timed_out: false });
    const env = await sg.run(browser, { cmd: ["sh", "-c", 'printf %s "$GREETING"; cat; pwd'], env: { GREETING: "hi " }, stdin: "in ", cwd: "/tmp" });
    assert.equal(env.stdout, "hi in /tmp\n");
    const failed = await sg.run(browser, ["sh", "-c", "exit 3"]);
    assert.equal(failed.exit_code, 3);
    const timedOut = await sg.run(browser, { cmd: ["sleep", "30"], timeout_seconds: 1 });
    assert.equal(timedOut.timed_out, true);
    await rejects(() => sg.run(browser, { cmd: [] }), 400, "invalid_argument");
  });

  test("shell: input, output, exit code", T, async () => {
    const sh = await sg.shell(browser, { cols: 100, rows: 30 });
    sh.write("echo sum=$((6*7)); stty size\n");
    let out = "";
    const it = sh[Symbol.asyncIterator]();
    while (!/30 100/.test(out)) {
      const { value, done } = await it.next();
      assert.ok(!done, `the shell ended early: ${JSON.stringify(out)}`);
      out += new TextDecoder().decode(value);
    }
    assert.match(out, /sum=42/);
    sh.resize(120, 40);
    // The gateway resizes before it passes on the next input, but bash's
    // readline can put the old size back as it readies the prompt (under
    // gVisor one resize in 30 to 60 landed in between); the gateway then
    // sets the size again within 3 s. So ask until it shows, for at most
    // 10 s.
    sh.write('for i in $(seq 100); do s=$(stty size); [ "$s" = "40 120" ] && break; sleep 0.1; done; echo "size=$s"; exit 5\n');
    for (let r = await it.next(); !r.done; r = await it.next()) out += new TextDecoder().decode(r.value);
    const exit = await sh.exit;
    const seen = `the terminal printed ${JSON.stringify(out)}; exit ${exit}, closed ${sh.closeCode} ${JSON.stringify(sh.closeReason)}`;
    assert.match(out, /size=40 120/, seen); // the resize reached the PTY
    assert.equal(exit, 5, seen);
    assert.equal(sh.closeCode, 1000, seen);
    // The control beside the refusal is the shell above.
    await rejects(() => sg.shell("s-0000000000000000"), 404, "not_found");
  });

  test("shell through a given WebSocket (the ws package)", T, async () => {
    // The test above used the runtime's own WebSocket where it has one
    // (Node 22 on), else ws; this one always ws.
    const { WebSocket } = await import("ws");
    const sh = await new Sandgate({ WebSocket }).shell(browser);
    sh.write("echo via-$((40+2)); exit 0\n");
    let out = "";
    for await (const chunk of sh) out += new TextDecoder().decode(chunk);
    assert.match(out, /via-42/);
    assert.equal(await sh.exit, 0);
  });

  test("files: put and get round trip", T, async () => {
    const bin = new Uint8Array(256 * 4).map((_, i) => i % 256);
    const w = await sg.files.put(browser, "/tmp/sdk.bin", bin);
    assert.deepEqual(w, { path: "/tmp/sdk.bin", size: bin.length, sha256: sha256(bin) });
    assert.deepEqual(await sg.files.get(browser, "/tmp/sdk.bin"), bin);

    await sg.files.put(browser, "/tmp/sdk dir ünï.txt", "héllo\n");
    assert.equal(await sg.files.getText(browser, "/tmp/sdk dir ünï.txt"), "héllo\n");
    const stream = new Blob([bin]).stream();
    await sg.files.put(browser, "/tmp/sdk-stream.bin", stream);
    assert.deepEqual(await sg.files.get(browser, "/tmp/sdk-stream.bin"), bin);
    assert.equal((await sg.run(browser, ["cat", "/tmp/sdk dir ünï.txt"])).stdout, "héllo\n");

    await rejects(() => sg.files.get(browser, "/tmp/sdk-missing"), 404, "not_found");
    await rejects(() => sg.files.put(browser, "/tmp/no/such/dir/f", "x"), 404, "not_found");
  });

  test("screenshot is stored, listed and downloadable", T, async () => {
    const a = await sg.screenshot(browser);
    assert.equal(a.kind, "screenshot");
    assert.equal(a.content_type, "image/png");
    const list = await sg.artifacts.list(browser);
    assert.ok(list.some((x) => x.id === a.id), "the screenshot is listed");

    const url = await sg.artifacts.url(a);
    assert.ok(!url.startsWith(SANDGATE_URL), `a presigned URL of the store, not the gateway: ${url}`);
    const png = await sg.artifacts.download(a.id);
    assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
    assert.equal(png.length, a.size);
    assert.equal(sha256(png), a.sha256);
    await rejects(() => sg.artifacts.download(browser.id + ".0000000000000000"), 404, "not_found");
  });

  test("preview: CDP discovery answers until revoked", T, async () => {
    const p = await sg.previews.create(browser, { scope: "cdp", ttl_seconds: 120 });
    assert.ok(p.url.startsWith(SANDGATE_URL + "/cdp/"), p.url);
    assert.equal(p.scope, "cdp");
    const before = await fetch(p.url + "/json/version");
    assert.equal(before.status, 200);
    assert.match((await before.json()).webSocketDebuggerUrl, /^ws:/);
    await sg.previews.revoke(browser, p);
    const afterRevoke = await fetch(p.url + "/json/version");
    assert.equal(afterRevoke.status, 401);
    await rejects(() => sg.previews.revoke("s-0000000000000000", p), 404, "not_found");
  });

  test("connectPlaywright opens the test page; the preview is revoked on disconnect", { ...T, skip: !SANDGATE_TEST_PAGE && "needs SANDGATE_TEST_PAGE" }, async () => {
    const before = (await sg.events(browser)).filter((e) => e.type === "preview_revoked").length;
    const b = await sg.connectPlaywright(browser, { ttl_seconds: 120 });
    const context = b.contexts()[0] ?? (await b.newContext());
    const page = await context.newPage();
    await page.goto(SANDGATE_TEST_PAGE);
    assert.equal(await page.title(), "Sandgate test page");
    assert.equal(await page.evaluate(() => window.answer), 42);
    await page.close();
    await b.close();
    const n = await poll(async () => {
      const k = (await sg.events(browser)).filter((e) => e.type === "preview_revoked").length;
      return k > before ? k : 0;
    });
    assert.ok(n > before, "the preview was revoked after the browser disconnected");
    assert.equal((await sg.sessions.get(browser)).state, "running", "disconnecting leaves the session running");
  });

  test("connectPuppeteer opens the test page", { ...T, skip: !SANDGATE_TEST_PAGE && "needs SANDGATE_TEST_PAGE" }, async () => {
    const b = await sg.connectPuppeteer(browser.id, { ttl_seconds: 120 });
    const page = await b.newPage();
    await page.goto(SANDGATE_TEST_PAGE);
    assert.equal(await page.title(), "Sandgate test page");
    assert.equal(await page.evaluate(() => window.answer), 42);
    await page.close();
    await b.disconnect();
    assert.equal((await sg.sessions.get(browser)).state, "running");
    await rejects(() => sg.connectPuppeteer("s-0000000000000000"), 404, "not_found");
  });

  test("desktop session: computer-use actions", T, async () => {
    const d = await sg.sessions.create({ kind: "desktop", screen: { width: 1024, height: 640 }, labels: label });
    made.push(d.id);
    assert.equal(d.kind, "desktop");

    const moved = await sg.action(d, { action: "mouse_move", coordinate: [200, 150] });
    assert.equal(moved.action, "mouse_move");
    assert.equal(typeof moved.took_ms, "number");
    const pos = await sg.action(d, { action: "cursor_position" });
    assert.deepEqual(pos.cursor, { x: 200, y: 150 });
    assert.equal((await sg.action(d, { action: "left_click", coordinate: [300, 200] })).action, "left_click");
    assert.deepEqual((await sg.action(d, { action: "cursor_position" })).cursor, { x: 300, y: 200 });
    assert.equal((await sg.action(d, { action: "key", text: "Escape" })).action, "key");
    assert.equal((await sg.action(d, { action: "scroll", scroll_direction: "down", scroll_amount: 2 })).action, "scroll");

    const shot = await sg.action(d, { action: "screenshot" });
    const png = Uint8Array.from(atob(shot.image), (c) => c.charCodeAt(0));
    assert.deepEqual([...png.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47]);
    assert.equal(shot.artifact.kind, "screenshot");

    // The same action outside the screen, and an unknown one, are refused.
    await rejects(() => sg.action(d, { action: "mouse_move", coordinate: [5000, 10] }), 400, "invalid_argument");
    await rejects(() => sg.action(d, { action: "teleport" }), 400, "invalid_argument");
  });

  test("credentials: create, list, get, delete; the secret never comes back", T, async () => {
    const secret = "sdk-secret-" + randomBytes(12).toString("hex");
    const name = "sdk " + randomBytes(4).toString("hex");
    const c = await sg.credentials.create({ name, kind: "basic", username: "qa", secret, destinations: [{ scheme: "https", host: "basic.sandgate.test" }] });
    assert.match(c.id, /^cred_[0-9a-f]{16}$/);
    assert.deepEqual(c.destinations, [{ scheme: "https", host: "basic.sandgate.test", port: 443, path_prefix: "/" }]);
    assert.equal(c.name, name);
    assert.equal(c.username, "qa");
    assert.ok(!("secret" in c));

    const list = await sg.credentials.list();
    assert.ok(list.some((x) => x.id === c.id && x.name === name), "listed");
    const got = await sg.credentials.get(c);
    assert.equal(got.id, c.id);
    for (const shown of [c, list, got]) {
      assert.ok(!JSON.stringify(shown).includes(secret), "the secret is not shown");
    }

    await sg.credentials.delete(c.id);
    await rejects(() => sg.credentials.get(c.id), 404, "not_found");
    assert.ok(!(await sg.credentials.list()).some((x) => x.id === c.id));
    await rejects(() => sg.credentials.create({ name, kind: "nonsense", secret, destinations: [{ scheme: "https", host: "a.sandgate.test" }] }), 400, "invalid_argument");
    await rejects(() => sg.credentials.create({ name, kind: "bearer", secret, destinations: [] }), 400, "invalid_argument");
  });

  test("snapshots and profiles: a new session has the snapshot's files and the profile's state", T, async () => {
    await sg.files.put(browser, "/home/sandgate/workspace/sdk-snap.txt", "kept\n");
    const snap = await sg.snapshots.create(browser);
    assert.equal(snap.processes_kept, false);
    assert.ok((await sg.snapshots.list(browser)).some((x) => x.id === snap.id));
    const p = await sg.profiles.create("sdk " + label.test);
    try {
      const s = await sg.sessions.create({ runtime: "runc", labels: label, snapshot: snap.id, profile: { id: p.id, persist: true } });
      made.push(s.id);
      assert.deepEqual(s.profile, { id: p.id, persist: true });
      assert.equal(await sg.files.getText(s, "/home/sandgate/workspace/sdk-snap.txt"), "kept\n");
      await sg.run(s, ["sh", "-c", "echo mark > ~/.sandgate-profile/sdk-mark"]);
      await rejects(() => sg.sessions.create({ runtime: "runc", labels: label, profile: { id: p.id, persist: true } }), 409, "conflict");
      await sg.sessions.delete(s);
      const got = await sg.profiles.get(p);
      assert.equal(got.current_version, 1);
      const again = await sg.sessions.create({ runtime: "runc", labels: label, profile: { id: p.id } });
      made.push(again.id);
      assert.equal((await sg.run(again, ["cat", "/home/sandgate/.sandgate-profile/sdk-mark"])).stdout, "mark\n");
      await sg.sessions.delete(again);
      assert.equal((await sg.profiles.rollback(p, 0)).current_version, 0);
    } finally {
      await sg.profiles.delete(p);
    }
    await rejects(() => sg.profiles.get(p), 404, "not_found");
  });

  test("events: the session's audit trail", T, async () => {
    const types = new Set((await sg.events(browser)).map((e) => e.type));
    for (const t of ["exec", "file_upload", "screenshot", "preview_issued"]) {
      assert.ok(types.has(t), `${t} in ${[...types]}`);
    }
    await rejects(() => sg.events("s-0000000000000000"), 404, "not_found");
  });

  test("delete stops the session", T, async () => {
    // The control: exec works until the session is deleted.
    assert.equal((await sg.run(browser, ["true"])).exit_code, 0);
    const gone = await sg.sessions.delete(browser);
    assert.equal(gone.id, browser.id);
    assert.equal(gone.state, "stopped");
    await rejects(() => sg.run(browser, ["true"]), 409, "conflict");
    const list = await sg.sessions.list();
    assert.ok(!list.some((s) => s.id === browser.id && s.state === "running"));
  });
});

// Retries, against a stand-in for the gateway's answers while a replica
// takes over from one that died (the gateway's own are TestKubeRelay's,
// through the Go SDK): a 503 unavailable with a Retry-After is sent
// again, its body whole, until answered or retryForMs is spent; a 503
// without one, or not in the gateway's JSON (a proxy's), or with
// retryForMs 0, is answered at once; so is a stream's upload. A gateway not listening yet is tried again.
describe("@sandgate/sdk retries", { concurrency: 1 }, () => {
  const http = import("node:http");
  let server;
  let base;
  const seen = [];
  let refuse = 0;
  const listen = async (port = 0) => {
    const { createServer } = await http;
    const srv = createServer(async (req, res) => {
      let body = "";
      for await (const c of req) body += c;
      seen.push(`${req.method} ${req.url} ${body}`);
      if (req.url.startsWith("/v1/sessions/s-0000000000000004")) {
        // A proxy's 503 in front of the gateway: it promises nothing.
        res.writeHead(503, { "Content-Type": "text/html", "Retry-After": "1" });
        return res.end("<html><body>503 Service Unavailable</body></html>");
      }
      if (req.url.startsWith("/v1/sessions/s-0000000000000002")) {
        res.writeHead(503, { "Content-Type": "application/json" });
        return res.end(`{"error":{"code":"unavailable","message":"the display did not answer"}}`);
      }
      if (refuse > 0) {
        refuse--;
        res.writeHead(503, { "Content-Type": "application/json", "Retry-After": "1" });
        return res.end(`{"error":{"code":"unavailable","message":"taking over; retry"}}`);
      }
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(`{"id":"s-0000000000000003","state":"running"}`);
    });
    await new Promise((r) => srv.listen(port, "127.0.0.1", r));
    return srv;
  };
  before(async () => {
    server = await listen();
    base = `http://127.0.0.1:${server.address().port}`;
  });
  after(() => server.close());

  test("a 503 that says to retry is sent again, body and all", T, async () => {
    seen.length = 0;
    refuse = 2;
    const t0 = Date.now();
    const s = await new Sandgate({ baseURL: base, apiKey: "k" }).sessions.create({ kind: "browser" });
    assert.equal(s.id, "s-0000000000000003");
    assert.ok(Date.now() - t0 >= 2000, `retried after ${Date.now() - t0} ms, not the 2 s said`);
    assert.equal(seen.length, 3);
    assert.equal(seen[0], seen[2]);
    assert.match(seen[2], /"kind":"browser"/);
  });

  test("not sent again: retryForMs 0, past retryForMs, no Retry-After, a stream", T, async () => {
    seen.length = 0;
    refuse = 1;
    await rejects(() => new Sandgate({ baseURL: base, apiKey: "k", retryForMs: 0 }).sessions.create({}), 503, "unavailable");
    assert.equal(seen.length, 1);
    refuse = 5;
    seen.length = 0;
    await rejects(() => new Sandgate({ baseURL: base, apiKey: "k", retryForMs: 1500 }).sessions.create({}), 503, "unavailable");
    assert.equal(seen.length, 2);
    refuse = 0;
    seen.length = 0;
    await rejects(() => new Sandgate({ baseURL: base, apiKey: "k" }).sessions.get("s-0000000000000002"), 503, "unavailable");
    assert.equal(seen.length, 1);
    seen.length = 0;
    await rejects(() => new Sandgate({ baseURL: base, apiKey: "k" }).sessions.get("s-0000000000000004"), 503, "unavailable");
    assert.equal(seen.length, 1, "a proxy's 503 with a Retry-After was sent again");
    refuse = 1;
    seen.length = 0;
    const stream = new ReadableStream({ start(c) { c.enqueue(new TextEncoder().encode("x")); c.close(); } });
    await rejects(() => new Sandgate({ baseURL: base, apiKey: "k" }).files.put("s-0000000000000003", "/tmp/x", stream), 503, "unavailable");
    assert.equal(seen.length, 1);
    refuse = 0;
  });

  test("a gateway that is not listening yet is tried again", T, async () => {
    const probe = await listen();
    const port = probe.address().port;
    await new Promise((r) => probe.close(r));
    await rejects(() => new Sandgate({ baseURL: `http://127.0.0.1:${port}`, apiKey: "k", retryForMs: 0 }).sessions.get("s-0000000000000003"), 0, "unavailable");
    let late;
    const started = new Promise((r) => setTimeout(async () => { late = await listen(port); r(); }, 1500));
    try {
      const s = await new Sandgate({ baseURL: `http://127.0.0.1:${port}`, apiKey: "k" }).sessions.get("s-0000000000000003");
      assert.equal(s.state, "running");
    } finally {
      await started;
      late?.close();
    }
  });
});
