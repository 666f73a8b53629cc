// Type-checked by `npm run typecheck` (tsc --noEmit), never run: the
// declarations in index.d.ts as a TypeScript user sees them, through the
// package's own name and exports.
import Sandgate, {
  SandgateError,
  type ActionResult,
  type Artifact,
  type Credential,
  type ExecFrame,
  type ExecResult,
  type Preview,
  type Session,
} from "@sandgate/sdk";

export async function usage(): Promise<void> {
  const sg = new Sandgate({ baseURL: "http://127.0.0.1:8080", apiKey: "sg_key" });
  const s: Session = await sg.sessions.create({ kind: "browser", ttl_seconds: 600, labels: { job: "x" } });
  const starting = await sg.sessions.create({ kind: "desktop", screen: { width: 1280, height: 800 } }, { wait: false });
  const state: "starting" | "running" | "stopping" | "stopped" | "failed" = starting.state;
  const all: Session[] = await sg.sessions.list();
  await sg.sessions.extend(s, 900);
  await sg.sessions.get(s.id);

  const p: Preview = await sg.previews.create(s, { scope: "vnc", view_only: true, ttl_seconds: 60 });
  await sg.previews.revoke(s, p);
  await sg.previews.revoke(s.id, p.id);

  const ex = await sg.exec(s, { cmd: ["sh", "-c", "echo hi"], env: { A: "1" }, timeout_seconds: 30 });
  for await (const f of ex) {
    const frame: ExecFrame = f;
    if (frame.stream === "exit") {
      const code: number = frame.exit_code;
      const timedOut: boolean = frame.timed_out;
      void code, timedOut;
    } else {
      const bytes: Uint8Array = frame.data;
      void bytes;
    }
  }
  const r: ExecResult = await sg.run(s, ["uname", "-a"]);
  const out: string = r.stdout + r.stderr + r.exit_code;

  const sh = await sg.shell(s, { cols: 120, rows: 40 });
  sh.write("ls\n");
  sh.resize(100, 30);
  for await (const chunk of sh) {
    const c: Uint8Array = chunk;
    void c;
    break;
  }
  sh.close();
  const code: number | null = await sh.exit;

  await sg.files.put(s, "/tmp/a.txt", "text");
  await sg.files.put(s, "/tmp/b.bin", new Uint8Array([1, 2, 3]));
  const bytes: Uint8Array = await sg.files.get(s, "/tmp/b.bin");
  const text: string = await sg.files.getText(s, "/tmp/a.txt");

  const shot: Artifact = await sg.screenshot(s);
  const arts: Artifact[] = await sg.artifacts.list(s);
  const url: string = await sg.artifacts.url(shot);
  const png: Uint8Array = await sg.artifacts.download(arts[0].id);

  const a1: ActionResult = await sg.action(s, { action: "left_click", coordinate: [10, 20], text: "shift" });
  await sg.action(s, { action: "key", text: "ctrl+l" });
  await sg.action(s, { action: "scroll", scroll_direction: "down", scroll_amount: 5 });
  await sg.action(s, { action: "fill_credential", credential: "cred_x", selector: "#password" });
  const cursor = (await sg.action(s, { action: "cursor_position" })).cursor;
  // @ts-expect-error mouse_move needs its coordinate
  await sg.action(s, { action: "mouse_move" });
  // @ts-expect-error no such action
  await sg.action(s, { action: "teleport" });

  const events = await sg.events(s);
  const c: Credential = await sg.credentials.create({ name: "api", kind: "bearer", secret: "s3cret", destinations: [{ scheme: "https", host: "api.example.com" }] });
  // @ts-expect-error the secret is never returned
  void c.secret;
  const creds: Credential[] = await sg.credentials.list();
  await sg.credentials.get(c);
  await sg.credentials.delete(c.id);
  const rts = await sg.runtimes();
  const usable: boolean = rts.runtimes[0].usable;
  const pools = await sg.pools();
  const used: number = (await sg.usage()).sessions;
  await sg.sessions.create({ kind: "browser", wait_seconds: 30 }).catch((err: SandgateError) => err.retryAfterSeconds);

  const browser = await sg.connectPlaywright(s, { ttl_seconds: 120, timeout: 30_000 });
  const title: string = await (await browser.contexts()[0].newPage()).title();
  await browser.close();
  const pb = await sg.connectPuppeteer(s.id, { ttl_seconds: 120 });
  await pb.disconnect();

  try {
    await sg.sessions.get("ses_missing");
  } catch (err) {
    if (err instanceof SandgateError) {
      const st: number = err.status;
      const cd: string = err.code;
      void st, cd;
    }
  }
  await sg.sessions.delete(s);
  void state, all, out, code, bytes, text, url, png, a1, cursor, events, creds, usable, pools, used, title;
}
