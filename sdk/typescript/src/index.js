// @sandgate/sdk: a client of Sandgate's management API (v1).
//
// Plain ESM with the types beside it in ../index.d.ts. It needs nothing
// but the runtime: global fetch, and a WebSocket for the shell (the
// built-in one where the runtime has it, else the `ws` package).
// playwright-core and puppeteer-core are optional peers, imported only by
// connectPlaywright and connectPuppeteer.

/** An error answered by the gateway: {"error": {"code", "message"}}. */
export class SandgateError extends Error {
  /**
   * @param {number} status HTTP status (0 when there was no answer)
   * @param {string} code contract code, such as "not_found"
   * @param {string} message the gateway's message
   */
  constructor(status, code, message) {
    super(message);
    this.name = "SandgateError";
    this.status = status;
    this.code = code;
  }
}

// The contract's codes by status, for answers that carry no error body
// (a proxy in front of the gateway, say).
const codeOfStatus = {
  400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied", 404: "not_found",
  409: "conflict", 413: "invalid_argument", 422: "unavailable_runtime", 429: "quota_exceeded",
  500: "internal", 503: "unavailable",
};

async function errorOf(resp) {
  const err = await errorOfBody(resp);
  const retry = Number.parseInt(resp.headers?.get?.("retry-after") ?? "", 10);
  if (retry > 0) err.retryAfterSeconds = retry;
  return err;
}

// gatewaySaid holds the errors whose body was the gateway's own JSON:
// only those promise, with a 503 and a Retry-After, that nothing was
// done (a proxy's 503 in front of the gateway does not).
const gatewaySaid = new WeakSet();

async function errorOfBody(resp) {
  let text = "";
  try {
    text = await resp.text();
  } catch {
    // the body is gone; the status still says what happened
  }
  try {
    const e = JSON.parse(text).error;
    if (e && typeof e.code === "string") {
      const err = new SandgateError(resp.status, e.code, String(e.message ?? e.code));
      gatewaySaid.add(err);
      return err;
    }
  } catch {
    // not the gateway's JSON
  }
  const code = codeOfStatus[resp.status] ?? (resp.status >= 500 ? "unavailable" : "invalid_argument");
  return new SandgateError(resp.status, code, text.trim().slice(0, 200) || resp.statusText || code);
}

/** How long requests are retried by default (SandgateOptions.retryForMs). */
export const DEFAULT_RETRY_FOR_MS = 60_000;

// How long, at most, a request no connection could be made for is
// retried.
const DIAL_RETRY_FOR_MS = 5_000;

// retryAfterOf is how long to wait before sending again a request that
// failed with err, when the gateway said nothing was done and to retry
// (its own 503 unavailable with a Retry-After, in its JSON: a replica
// taking over from one that died, none leading yet, one stopping) or no
// connection could be made; 0 otherwise.
function retryAfterOf(err) {
  if (err.code !== "unavailable" || !(err.retryAfterSeconds > 0)) return 0;
  const said = err.status === 503 && gatewaySaid.has(err) || err.status === 0;
  return said ? err.retryAfterSeconds * 1000 : 0;
}

// refused: fetch failed to connect (nothing was sent).
function refused(err) {
  for (let e = err; e; e = e.cause) {
    if (e.code === "ECONNREFUSED") return true;
  }
  return false;
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => { signal?.removeEventListener?.("abort", stop); resolve(); }, ms);
    const stop = () => { clearTimeout(t); reject(signal.reason); };
    signal?.addEventListener?.("abort", stop, { once: true });
  });
}

function idOf(x, what) {
  const id = typeof x === "string" ? x : x?.id;
  if (typeof id !== "string" || id === "") {
    throw new TypeError(`${what} must be an id or an object with an id`);
  }
  return encodeURIComponent(id);
}

function base64ToBytes(s) {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** Client of one gateway with one API key. */
export class Sandgate {
  /** @param {import("../index.d.ts").SandgateOptions} [opts] */
  constructor(opts = {}) {
    const env = globalThis.process?.env ?? {};
    const baseURL = opts.baseURL ?? env.SANDGATE_URL;
    const apiKey = opts.apiKey ?? env.SANDGATE_API_KEY;
    if (!baseURL) throw new TypeError("baseURL is required (or set SANDGATE_URL)");
    if (!apiKey) throw new TypeError("apiKey is required (or set SANDGATE_API_KEY)");
    this.baseURL = String(baseURL).replace(/\/+$/, "");
    this._apiKey = apiKey;
    this._fetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
    this._retryForMs = Math.max(0, opts.retryForMs ?? DEFAULT_RETRY_FOR_MS);
    this._WebSocket = opts.WebSocket;

    this.sessions = {
      create: (req = {}, o = {}) =>
        this._json("POST", "/v1/sessions" + (o.wait === false ? "?wait=false" : ""), req, o),
      list: async (o) => (await this._json("GET", "/v1/sessions", undefined, o)).sessions,
      get: (s, o) => this._json("GET", `/v1/sessions/${idOf(s, "session")}`, undefined, o),
      extend: (s, ttlSeconds, o) =>
        this._json("POST", `/v1/sessions/${idOf(s, "session")}/extend`, { ttl_seconds: ttlSeconds }, o),
      delete: (s, o) => this._json("DELETE", `/v1/sessions/${idOf(s, "session")}`, undefined, o),
    };
    this.previews = {
      create: (s, req, o) =>
        this._json("POST", `/v1/sessions/${idOf(s, "session")}/previews`, req, o),
      revoke: async (s, p, o) => {
        await this._request("DELETE", `/v1/sessions/${idOf(s, "session")}/previews/${idOf(p, "preview")}`, undefined, o);
      },
    };
    this.files = {
      put: (s, path, data, o) => this._putFile(s, path, data, o),
      get: async (s, path, o) => {
        const resp = await this._request("GET", this._filePath(s, path), undefined, o);
        return new Uint8Array(await resp.arrayBuffer());
      },
      getText: async (s, path, o) => {
        const resp = await this._request("GET", this._filePath(s, path), undefined, o);
        return resp.text();
      },
      stream: async (s, path, o) => {
        const resp = await this._request("GET", this._filePath(s, path), undefined, o);
        return resp.body;
      },
    };
    this.artifacts = {
      list: async (s, o) => (await this._json("GET", `/v1/sessions/${idOf(s, "session")}/artifacts`, undefined, o)).artifacts,
      url: (a, o) => this._artifactURL(a, o),
      download: async (a, o) => {
        const url = await this._artifactURL(a, o);
        // The presigned URL is its own credential: no API key goes to the
        // artifact store.
        const resp = await this._fetch(url, { signal: o?.signal });
        if (!resp.ok) throw await errorOf(resp);
        return new Uint8Array(await resp.arrayBuffer());
      },
    };
    this.profiles = {
      create: (name, o) => this._json("POST", "/v1/profiles", { name }, o),
      list: async (o) => (await this._json("GET", "/v1/profiles", undefined, o)).profiles,
      get: (p, o) => this._json("GET", `/v1/profiles/${idOf(p, "profile")}`, undefined, o),
      rollback: (p, version, o) => this._json("POST", `/v1/profiles/${idOf(p, "profile")}/rollback`, { version }, o),
      delete: async (p, o) => {
        await this._request("DELETE", `/v1/profiles/${idOf(p, "profile")}`, undefined, o);
      },
    };
    this.snapshots = {
      create: (s, o) => this._json("POST", `/v1/sessions/${idOf(s, "session")}/snapshots`, {}, o),
      list: async (s, o) => (await this._json("GET", `/v1/sessions/${idOf(s, "session")}/snapshots`, undefined, o)).snapshots,
    };
    this.credentials = {
      create: (req, o) => this._json("POST", "/v1/credentials", req, o),
      list: async (o) => (await this._json("GET", "/v1/credentials", undefined, o)).credentials,
      get: (c, o) => this._json("GET", `/v1/credentials/${idOf(c, "credential")}`, undefined, o),
      delete: async (c, o) => {
        await this._request("DELETE", `/v1/credentials/${idOf(c, "credential")}`, undefined, o);
      },
    };
  }

  /** Sends a request with the API key; throws SandgateError unless 2xx. */
  async _request(method, path, body, o = {}, extra = {}) {
    const headers = { Authorization: `Bearer ${this._apiKey}`, ...extra.headers };
    let payload;
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      payload = JSON.stringify(body);
    }
    if (extra.body !== undefined) payload = extra.body;
    // A body that can be sent again (none, a string, bytes) is, while
    // the gateway says nothing was done (retryAfterOf), for retryForMs.
    const replayable = payload === undefined || typeof payload === "string" || payload instanceof Uint8Array;
    const start = Date.now();
    for (;;) {
      let resp;
      let failed;
      try {
        resp = await this._fetch(this.baseURL + path, {
          method, headers, body: payload, signal: o?.signal, redirect: extra.redirect,
          ...(extra.duplex ? { duplex: extra.duplex } : {}),
        });
      } catch (err) {
        if (err?.name === "AbortError" || o?.signal?.aborted) throw err;
        failed = new SandgateError(0, "unavailable", `the gateway at ${this.baseURL} did not answer: ${err?.message ?? err}`);
        failed.cause = err;
        if (refused(err)) failed.retryAfterSeconds = 1; // no connection: nothing was sent
      }
      if (resp && resp.status < 400) return resp;
      if (resp) failed = await errorOf(resp);
      const wait = retryAfterOf(failed);
      // No connection: no gateway at the address, perhaps, which the
      // caller should hear of soon.
      const until = start + (failed.status === 0 ? Math.min(this._retryForMs, DIAL_RETRY_FOR_MS) : this._retryForMs);
      if (!wait || !replayable || Date.now() + wait > until) throw failed;
      await sleep(wait, o?.signal);
    }
  }

  async _json(method, path, body, o) {
    const resp = await this._request(method, path, body, o);
    if (resp.status === 204) return undefined;
    return resp.json();
  }

  _filePath(s, path) {
    if (typeof path !== "string" || !path.startsWith("/")) throw new TypeError("path must be absolute");
    return `/v1/sessions/${idOf(s, "session")}/files?path=${encodeURIComponent(path)}`;
  }

  async _putFile(s, path, data, o) {
    let body = data;
    let duplex;
    if (typeof data === "string") body = new TextEncoder().encode(data);
    else if (data instanceof ArrayBuffer) body = new Uint8Array(data);
    else if (typeof data?.getReader === "function") duplex = "half"; // a ReadableStream
    const resp = await this._request("PUT", this._filePath(s, path), undefined, o, {
      headers: { "Content-Type": "application/octet-stream" }, body, duplex,
    });
    return resp.json();
  }

  async _artifactURL(a, o) {
    const resp = await this._request("GET", `/v1/artifacts/${idOf(a, "artifact")}`, undefined, o, { redirect: "manual" });
    const loc = resp.headers.get("location");
    if (resp.status < 300 || resp.status >= 400 || !loc) {
      throw new SandgateError(resp.status, "internal", "the gateway did not redirect to the artifact");
    }
    return new URL(loc, this.baseURL).toString();
  }

  /** The runtime handlers, usable or not, and the default. */
  runtimes(o) {
    return this._json("GET", "/v1/runtimes", undefined, o);
  }

  /** The warm pools. */
  async pools(o) {
    return (await this._json("GET", "/v1/pools", undefined, o)).pools;
  }

  /** What the tenant holds against its quotas. */
  async usage(o) {
    return this._json("GET", "/v1/usage", undefined, o);
  }

  /** The session's audit trail. */
  async events(s, o) {
    return (await this._json("GET", `/v1/sessions/${idOf(s, "session")}/events`, undefined, o)).events;
  }

  /** A screenshot stored as an artifact. */
  screenshot(s, o) {
    return this._json("POST", `/v1/sessions/${idOf(s, "session")}/screenshot`, {}, o);
  }

  /** One computer-use action (or fill_credential). */
  action(s, action, o) {
    return this._json("POST", `/v1/sessions/${idOf(s, "session")}/actions`, action, o);
  }

  /**
   * Starts a command. The promise settles once the gateway accepted it
   * (errors throw here); the result is an async iterable of output and,
   * last, the exit record.
   */
  async exec(s, req, o = {}) {
    const body = Array.isArray(req) ? { cmd: req } : req;
    const ctl = new AbortController();
    if (o.signal) {
      if (o.signal.aborted) ctl.abort(o.signal.reason);
      else o.signal.addEventListener("abort", () => ctl.abort(o.signal.reason), { once: true });
    }
    const resp = await this._request("POST", `/v1/sessions/${idOf(s, "session")}/exec`, body, { signal: ctl.signal });
    return new Execution(resp, ctl);
  }

  /** Runs a command to its end and collects its output as text. */
  async run(s, req, o) {
    const ex = await this.exec(s, req, o);
    return ex.collect();
  }

  /** Opens an interactive shell (bash on a PTY) over a WebSocket. */
  async shell(s, o = {}) {
    const WS = this._WebSocket ?? globalThis.WebSocket ?? (await importWS());
    const id = idOf(s, "session");
    const u = new URL(`${this.baseURL}/v1/sessions/${id}/shell`);
    u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    if (o.cols) u.searchParams.set("cols", String(o.cols));
    if (o.rows) u.searchParams.set("rows", String(o.rows));
    const ws = new WS(u.toString(), { headers: { Authorization: `Bearer ${this._apiKey}` } });
    ws.binaryType = "arraybuffer";
    const sh = new Shell(ws);
    try {
      await sh._opened;
    } catch (err) {
      // The upgrade was refused; the session's own answer says why.
      await this.sessions.get(s, o);
      throw new SandgateError(0, "unavailable", `the shell could not be opened: ${err?.message ?? err}`);
    }
    // The size in the query does not always reach the terminal (under
    // gVisor the PTY starts at 0x0); a resize first, before any input, does.
    if (o.cols && o.rows) sh.resize(o.cols, o.rows);
    return sh;
  }

  /**
   * A fresh cdp preview of the session and Playwright connected to it
   * (chromium.connectOverCDP). The preview is revoked when the browser
   * disconnects.
   */
  async connectPlaywright(s, o = {}) {
    const { ttl_seconds, chromium: given, ...connectOpts } = o;
    const chromium = given ?? (await importPeer(["playwright-core", "playwright"], "connectPlaywright")).chromium;
    const p = await this.previews.create(s, { scope: "cdp", ...(ttl_seconds ? { ttl_seconds } : {}) });
    let browser;
    try {
      // ws_url: the browser's endpoint itself, no discovery request first.
      browser = await chromium.connectOverCDP(p.ws_url ?? p.url, connectOpts);
    } catch (err) {
      await this.previews.revoke(s, p).catch(() => {});
      throw err;
    }
    browser.on("disconnected", () => this.previews.revoke(s, p).catch(() => {}));
    return browser;
  }

  /**
   * A fresh cdp preview of the session and Puppeteer connected to it. The
   * preview URL goes in as browserWSEndpoint: Puppeteer's browserURL
   * drops the URL's path, and the token with it.
   */
  async connectPuppeteer(s, o = {}) {
    const { ttl_seconds, puppeteer: given, ...connectOpts } = o;
    const mod = given ?? (await importPeer(["puppeteer-core", "puppeteer"], "connectPuppeteer"));
    const puppeteer = mod.default ?? mod;
    const p = await this.previews.create(s, { scope: "cdp", ...(ttl_seconds ? { ttl_seconds } : {}) });
    let browser;
    try {
      browser = await puppeteer.connect({ ...connectOpts, browserWSEndpoint: p.ws_url ?? p.url.replace(/^http/, "ws") });
    } catch (err) {
      await this.previews.revoke(s, p).catch(() => {});
      throw err;
    }
    browser.on("disconnected", () => this.previews.revoke(s, p).catch(() => {}));
    return browser;
  }
}

async function importPeer(names, what) {
  for (const n of names) {
    try {
      return await import(n);
    } catch (err) {
      if (err?.code !== "ERR_MODULE_NOT_FOUND") throw err;
    }
  }
  throw new Error(`${what} needs ${names.join(" or ")} installed`);
}

async function importWS() {
  try {
    const m = await import("ws");
    return m.WebSocket ?? m.default;
  } catch {
    throw new Error("this runtime has no WebSocket: install the ws package (or use Node 22 or later)");
  }
}

/** A running command's output: an async iterable of ExecFrame. */
export class Execution {
  constructor(resp, ctl) {
    this._resp = resp;
    this._ctl = ctl;
    this._used = false;
  }

  async *[Symbol.asyncIterator]() {
    if (this._used) throw new Error("an Execution's output can be read once");
    this._used = true;
    const reader = this._resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    let ended = false;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (line === "") continue;
          const r = JSON.parse(line);
          if (r.exit_code !== undefined) {
            ended = true;
            const exit = { stream: "exit", exit_code: r.exit_code, duration_ms: r.duration_ms ?? 0, timed_out: !!r.timed_out };
            if (r.error) exit.error = r.error;
            yield exit;
          } else if (r.stream === "stdout" || r.stream === "stderr") {
            yield { stream: r.stream, data: r.data ? base64ToBytes(r.data) : new Uint8Array() };
          }
        }
      }
    } finally {
      if (!ended) this._ctl.abort(); // the caller left early: stop the command
      reader.releaseLock?.();
    }
    if (!ended) {
      throw new SandgateError(0, "unavailable", "the exec stream ended without the command's exit");
    }
  }

  /** Reads the output to the end: text of both streams and the exit. */
  async collect() {
    const out = new TextDecoder();
    const err = new TextDecoder();
    let stdout = "";
    let stderr = "";
    let exit;
    for await (const f of this) {
      if (f.stream === "stdout") stdout += out.decode(f.data, { stream: true });
      else if (f.stream === "stderr") stderr += err.decode(f.data, { stream: true });
      else exit = f;
    }
    stdout += out.decode();
    stderr += err.decode();
    const res = { stdout, stderr, exit_code: exit.exit_code, duration_ms: exit.duration_ms, timed_out: exit.timed_out };
    if (exit.error) res.error = exit.error;
    return res;
  }

  /** Stops reading; the gateway kills the command. */
  cancel() {
    this._ctl.abort();
  }
}

/** An interactive shell: write input, iterate its output, await its exit. */
export class Shell {
  constructor(ws) {
    this._ws = ws;
    this._queue = [];
    this._waiting = null;
    this._done = false;
    let exitCode = null;
    let resolveExit;
    this.exit = new Promise((r) => (resolveExit = r));
    this._opened = new Promise((resolve, reject) => {
      ws.addEventListener("open", () => resolve(), { once: true });
      ws.addEventListener("error", (ev) => reject(ev?.error ?? new Error(ev?.message ?? "WebSocket error")), { once: true });
    });
    this._opened.catch(() => {});
    ws.addEventListener("message", (ev) => {
      if (typeof ev.data === "string") {
        try {
          const m = JSON.parse(ev.data);
          if (m.type === "exit") exitCode = m.exit_code;
        } catch {
          // control messages are JSON; anything else is ignored
        }
        return;
      }
      this._push(new Uint8Array(ev.data));
    });
    ws.addEventListener("close", (ev) => {
      this.closeCode = ev.code;
      this.closeReason = ev.reason;
      this._done = true;
      this._push(null);
      resolveExit(exitCode);
    });
  }

  _push(chunk) {
    if (this._waiting) {
      const w = this._waiting;
      this._waiting = null;
      w(chunk);
    } else if (chunk !== null) {
      this._queue.push(chunk);
    }
  }

  /** Sends input: keystrokes, commands ending in "\n". */
  write(data) {
    this._ws.send(typeof data === "string" ? new TextEncoder().encode(data) : data);
  }

  /** Resizes the terminal. */
  resize(cols, rows) {
    this._ws.send(JSON.stringify({ type: "resize", cols, rows }));
  }

  /** Closes the connection; the gateway ends the shell. */
  close() {
    this._ws.close(1000);
  }

  async *[Symbol.asyncIterator]() {
    for (;;) {
      if (this._queue.length > 0) {
        yield this._queue.shift();
        continue;
      }
      if (this._done) return;
      const chunk = await new Promise((r) => (this._waiting = r));
      if (chunk === null) return;
      yield chunk;
    }
  }
}

export default Sandgate;
