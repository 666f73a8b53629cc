// Types of @sandgate/sdk (src/index.js). Field names are the API's own
// (snake_case), as the gateway sends and takes them.

import type {
  Browser as PlaywrightBrowser,
  BrowserType as PlaywrightBrowserType,
  ConnectOverCDPOptions,
} from "playwright-core";
import type {
  Browser as PuppeteerBrowser,
  ConnectOptions as PuppeteerConnectOptions,
} from "puppeteer-core";

/** The contract's error codes. */
export type ErrorCode =
  | "invalid_argument"
  | "unauthenticated"
  | "permission_denied"
  | "not_found"
  | "conflict"
  | "unavailable_runtime"
  | "quota_exceeded"
  | "internal"
  | "unavailable"
  | (string & {});

/**
 * An error answered by the gateway ({"error": {"code", "message"}}), or a
 * gateway that did not answer (status 0, code "unavailable").
 */
export declare class SandgateError extends Error {
  constructor(status: number, code: ErrorCode, message: string);
  readonly name: "SandgateError";
  /** HTTP status; 0 when there was no answer. */
  status: number;
  code: ErrorCode;
  /**
   * The gateway's Retry-After, in seconds: on a create refused with
   * quota_exceeded, or an unavailable answer (retried for as long as
   * retryForMs lets).
   */
  retryAfterSeconds?: number;
}

/** How long requests are retried by default (SandgateOptions.retryForMs). */
export declare const DEFAULT_RETRY_FOR_MS: number;

export interface SandgateOptions {
  /** The gateway, e.g. "https://sandgate.example.com". Default: $SANDGATE_URL. */
  baseURL?: string;
  /** An API key. Default: $SANDGATE_API_KEY. */
  apiKey?: string;
  /** A fetch to use instead of the global one. */
  fetch?: typeof fetch;
  /**
   * How long, in all, a request is sent again while the gateway says
   * nothing was done and to retry (503 unavailable with a Retry-After: a
   * gateway replica taking over from one that died, none leading yet,
   * one stopping), waiting as it says, or while no connection can be made
   * (for 5 s at most). A request whose body is a stream is sent once.
   * Default DEFAULT_RETRY_FOR_MS (a minute); 0 sends each request once.
   */
  retryForMs?: number;
  /**
   * A WebSocket constructor for the shell that takes headers as
   * `new WebSocket(url, { headers })` (Node's built-in one and `ws` do).
   * Default: the global WebSocket, else the `ws` package.
   */
  WebSocket?: new (url: string, init: { headers: Record<string, string> }) => any;
}

/** Per-call options. */
export interface RequestOptions {
  signal?: AbortSignal;
}

/** A session, or its id. */
export type SessionRef = string | { id: string };

export type SessionKind = "browser" | "desktop";
export type RuntimeName = "kata" | "gvisor" | "runc" | (string & {});
export type SessionState = "starting" | "running" | "stopping" | "stopped" | "failed";

export interface Resources {
  cpus: number;
  memory_mb: number;
  pids: number;
}

export interface Screen {
  width: number;
  height: number;
}

/** A credential bound to a session's egress: added to requests to the destination. */
export interface CredentialBinding {
  credential: string;
  scheme: "http" | "https" | (string & {});
  host: string;
  port?: number;
  path_prefix?: string;
  /** What fill_credential types for the secret: "placeholder" (default) or "value". */
  fill?: "placeholder" | "value";
}

export interface CreateSessionRequest {
  kind?: SessionKind;
  runtime?: RuntimeName;
  ttl_seconds?: number;
  idle_timeout_seconds?: number;
  resources?: Partial<Resources>;
  screen?: Screen;
  record?: boolean;
  egress?: { allow?: string[] };
  credentials?: CredentialBinding[];
  labels?: Record<string, string>;
  /**
   * How long a create over the tenant's quotas or the gateway's capacity
   * may wait in line for room (0..600; default 0: refused at once).
   */
  wait_seconds?: number;
  /**
   * Start with this browser profile; with persist, write it back when the
   * session ends cleanly (and hold it alone meanwhile: another create gets
   * 409 conflict, or waits up to wait_seconds).
   */
  profile?: { id: string; persist?: boolean };
  /** Start from this workspace snapshot (its files; no processes). */
  snapshot?: string;
  /**
   * Issue a preview with the session (in the answer's preview), saving a
   * request before the client connects. Not with wait: false.
   */
  preview?: CreatePreviewRequest;
}

/** A browser profile kept for the tenant, sealed, with versions. */
export interface Profile {
  id: string;
  name: string;
  created_at: string;
  updated_at: string;
  /** What a session starts with; 0 is a fresh profile. */
  current_version: number;
  versions: ProfileVersion[];
  in_use: boolean;
}

export interface ProfileVersion {
  version: number;
  size: number;
  sha256: string;
  stored_bytes: number;
  files: number;
  created_at: string;
  session: string;
}

/** A session's home and workspace as a tar artifact: files, never processes. */
export interface Snapshot {
  id: string;
  session: string;
  size: number;
  sha256: string;
  created_at: string;
  paths: string[];
  processes_kept: false;
  note: string;
}

/** What the tenant holds against its quotas (0: no limit). */
export interface Usage {
  sessions: number;
  cpus: number;
  memory_mb: number;
  recordings: number;
  creates_last_minute: number;
  /** What the artifacts take in the store (counted at most 30 s ago); -1: the store did not answer. */
  artifact_bytes: number;
  /** The tenant's creates waiting for room. */
  queued: number;
  max_sessions: number;
  max_cpus: number;
  max_memory_mb: number;
  max_recordings: number;
  max_creates_per_minute: number;
  max_artifact_bytes: number;
}

export interface CreateSessionOptions extends RequestOptions {
  /** false: answer at once with the session "starting" (default: wait until it runs). */
  wait?: boolean;
}

export interface Session {
  id: string;
  kind: SessionKind;
  runtime: RuntimeName;
  isolation: string;
  state: SessionState;
  created_at: string;
  expires_at: string;
  idle_timeout_seconds?: number;
  resources: Resources;
  screen: Screen;
  record: boolean;
  labels: Record<string, string> | null;
  egress: { allow: string[] | null; credentials?: CredentialBinding[] };
  /** "warm" (from a warm pool) or "cold". */
  start: string;
  profile?: { id: string; persist: boolean };
  snapshot?: string;
  failure?: string;
  /** Only in the answer to a create that asked for a preview. */
  preview?: Preview;
}

export type PreviewScope = "cdp" | "vnc" | "view" | "review";

export interface CreatePreviewRequest {
  scope: PreviewScope;
  ttl_seconds?: number;
  /** vnc and view only: the gateway drops the viewer's input. */
  view_only?: boolean;
}

export interface Preview {
  id: string;
  url: string;
  /** cdp only: the browser's WebSocket endpoint, for clients that connect with no discovery request. */
  ws_url?: string;
  expires_at: string;
  scope: PreviewScope;
  view_only: boolean;
}

export interface ExecRequest {
  /** The program first, then its arguments. */
  cmd: string[];
  env?: Record<string, string>;
  /** Absolute working directory. */
  cwd?: string;
  /** 1 to 3600; default 300. */
  timeout_seconds?: number;
  stdin?: string;
  stdin_base64?: string;
  /** "sandgate" (default) or "root", if the tenant may. */
  user?: "sandgate" | "root";
}

/** Output of a running command, as it comes. */
export interface ExecOutput {
  stream: "stdout" | "stderr";
  data: Uint8Array;
}

/** The last frame: how the command ended. */
export interface ExecExit {
  stream: "exit";
  exit_code: number;
  duration_ms: number;
  timed_out: boolean;
  /** Set when the command's end could not be read. */
  error?: string;
}

export type ExecFrame = ExecOutput | ExecExit;

/** What run() collects. */
export interface ExecResult {
  stdout: string;
  stderr: string;
  exit_code: number;
  duration_ms: number;
  timed_out: boolean;
  error?: string;
}

/** A running command: iterate its frames once, or collect() them. */
export declare class Execution implements AsyncIterable<ExecFrame> {
  private constructor();
  [Symbol.asyncIterator](): AsyncIterator<ExecFrame>;
  /** Reads to the end; output decoded as UTF-8. */
  collect(): Promise<ExecResult>;
  /** Stops reading; the gateway kills the command. */
  cancel(): void;
}

export interface ShellOptions extends RequestOptions {
  cols?: number;
  rows?: number;
}

/** An interactive bash on a PTY. Iterate its output; await exit. */
export declare class Shell implements AsyncIterable<Uint8Array> {
  private constructor();
  [Symbol.asyncIterator](): AsyncIterator<Uint8Array>;
  /** The shell's exit code once the connection closed; null if the gateway sent none. */
  readonly exit: Promise<number | null>;
  /** The WebSocket close code and reason, once closed. */
  readonly closeCode?: number;
  readonly closeReason?: string;
  write(data: string | Uint8Array): void;
  resize(cols: number, rows: number): void;
  close(): void;
}

export interface FileWritten {
  path: string;
  size: number;
  sha256: string;
}

export type FileData = string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array>;

/** Computer-use actions, in Anthropic's computer tool's shape. Coordinates in screen pixels. */
export type ComputerAction =
  | { action: "screenshot" | "cursor_position" }
  | { action: "mouse_move"; coordinate: [number, number] }
  | {
      action: "left_click" | "right_click" | "middle_click" | "double_click" | "triple_click";
      coordinate?: [number, number];
      /** Modifiers held during the click, e.g. "shift" or "ctrl+shift". */
      text?: string;
    }
  | { action: "left_click_drag"; start_coordinate: [number, number]; coordinate: [number, number] }
  | { action: "left_mouse_down" | "left_mouse_up"; coordinate?: [number, number] }
  | {
      action: "scroll";
      scroll_direction: "up" | "down" | "left" | "right";
      /** 1 to 50; default 3. */
      scroll_amount?: number;
      coordinate?: [number, number];
      text?: string;
    }
  | { action: "type"; text: string }
  /** Space-separated combos in xdotool's names: "ctrl+l", "Return". */
  | { action: "key"; text: string }
  | { action: "hold_key"; text: string; duration: number }
  | { action: "wait"; duration: number };

/** Types a bound credential into a page field (browser sessions, bound origins only). */
export interface FillCredentialAction {
  action: "fill_credential";
  credential: string;
  selector: string;
  /** "secret" (default) or "username". */
  field?: "secret" | "username";
}

export type Action = ComputerAction | FillCredentialAction;

export interface ActionResult {
  action: string;
  /** cursor_position */
  cursor?: { x: number; y: number };
  /** screenshot and wait: base64 PNG */
  image?: string;
  /** screenshot and wait: the stored screenshot */
  artifact?: Artifact;
  took_ms: number;
}

export type ArtifactKind = "screenshot" | "download" | "recording" | "recording_segment" | "log" | (string & {});

export interface Artifact {
  id: string;
  session: string;
  kind: ArtifactKind;
  name: string;
  size: number;
  sha256: string;
  content_type: string;
  created_at: string;
  source_url?: string;
}

export interface SessionEvent {
  time: string;
  type: string;
  fields?: Record<string, unknown>;
}

export type CredentialKind = "basic" | "bearer" | "header" | "cookie";

export interface CreateCredentialRequest {
  name: string;
  kind: CredentialKind;
  username?: string;
  /** The header or cookie name (kinds header and cookie). */
  field_name?: string;
  secret: string;
  /**
   * Where the credential may go (1-16): a session binds it only within one
   * of these, else 403. Sealed with the secret; they cannot be changed.
   */
  destinations: CredentialDestination[];
  /** Lets a binding use fill "value" (the agent can read the typed secret). */
  allow_value_fill?: boolean;
}

/** A place a credential may go: port from the scheme and path prefix "/" by default. */
export interface CredentialDestination {
  scheme: "http" | "https" | (string & {});
  host: string;
  port?: number;
  path_prefix?: string;
}

/** A credential as the API shows it: never its secret. */
export interface Credential {
  id: string;
  name: string;
  kind: CredentialKind;
  username?: string;
  field_name?: string;
  destinations: CredentialDestination[];
  allow_value_fill?: boolean;
  created_at: string;
}

export interface Runtime {
  name: RuntimeName;
  /** "vm", "kernel" or "container". */
  isolation: string;
  usable: boolean;
  /** Why not usable. */
  reason?: string;
  version?: string;
}

export interface Runtimes {
  default: RuntimeName;
  runtimes: Runtime[];
}

export interface Pool {
  key: string;
  kind: SessionKind;
  runtime: RuntimeName;
  screen: Screen;
  resources: Resources;
  size: number;
  available: number;
  starting: number;
  frozen: number;
  /** Available sessions whose start is still busy; a claim prefers settled ones. */
  settling: number;
  claims: number;
  misses: number;
  refills: number;
  refill_errors: number;
  refill_avg_ms: number;
  last_refill_ms: number;
  refills_per_minute: number;
}

export interface ConnectPlaywrightOptions extends ConnectOverCDPOptions {
  /** The preview's lifetime (default: the gateway's, 5 minutes). */
  ttl_seconds?: number;
  /** Your own chromium (e.g. from "playwright"); default: import("playwright-core"). */
  chromium?: PlaywrightBrowserType;
}

export interface ConnectPuppeteerOptions extends Omit<PuppeteerConnectOptions, "browserWSEndpoint" | "browserURL"> {
  /** The preview's lifetime (default: the gateway's, 5 minutes). */
  ttl_seconds?: number;
  /** Your own puppeteer module; default: import("puppeteer-core"). */
  puppeteer?: { connect(opts: PuppeteerConnectOptions): Promise<PuppeteerBrowser> };
}

export declare class Sandgate {
  constructor(opts?: SandgateOptions);
  readonly baseURL: string;

  sessions: {
    create(req?: CreateSessionRequest, opts?: CreateSessionOptions): Promise<Session>;
    list(opts?: RequestOptions): Promise<Session[]>;
    get(session: SessionRef, opts?: RequestOptions): Promise<Session>;
    /** Sets the session to end ttlSeconds from now, within the tenant's maximum. */
    extend(session: SessionRef, ttlSeconds: number, opts?: RequestOptions): Promise<Session>;
    /** Stops the session; its artifacts are finalised. */
    delete(session: SessionRef, opts?: RequestOptions): Promise<Session>;
  };

  previews: {
    create(session: SessionRef, req: CreatePreviewRequest, opts?: RequestOptions): Promise<Preview>;
    /** Revokes; live connections close. */
    revoke(session: SessionRef, preview: string | { id: string }, opts?: RequestOptions): Promise<void>;
  };

  files: {
    /** Writes a file in the session (its directory must exist). */
    put(session: SessionRef, path: string, data: FileData, opts?: RequestOptions): Promise<FileWritten>;
    /** A file's bytes, or a directory as a tar archive. */
    get(session: SessionRef, path: string, opts?: RequestOptions): Promise<Uint8Array>;
    getText(session: SessionRef, path: string, opts?: RequestOptions): Promise<string>;
    stream(session: SessionRef, path: string, opts?: RequestOptions): Promise<ReadableStream<Uint8Array>>;
  };

  artifacts: {
    list(session: SessionRef, opts?: RequestOptions): Promise<Artifact[]>;
    /** A short-lived presigned URL of the artifact (the gateway's 302). */
    url(artifact: string | { id: string }, opts?: RequestOptions): Promise<string>;
    download(artifact: string | { id: string }, opts?: RequestOptions): Promise<Uint8Array>;
  };

  /** Browser profiles kept between sessions. */
  profiles: {
    create(name: string, opts?: RequestOptions): Promise<Profile>;
    list(opts?: RequestOptions): Promise<Profile[]>;
    get(profile: string | { id: string }, opts?: RequestOptions): Promise<Profile>;
    /** Makes a kept version current (0: a fresh profile). */
    rollback(profile: string | { id: string }, version: number, opts?: RequestOptions): Promise<Profile>;
    delete(profile: string | { id: string }, opts?: RequestOptions): Promise<void>;
  };

  /** Workspace snapshots of a session. */
  snapshots: {
    create(session: SessionRef, opts?: RequestOptions): Promise<Snapshot>;
    list(session: SessionRef, opts?: RequestOptions): Promise<Snapshot[]>;
  };

  /** The tenant's vault. Secrets go in and never come back. */
  credentials: {
    create(req: CreateCredentialRequest, opts?: RequestOptions): Promise<Credential>;
    list(opts?: RequestOptions): Promise<Credential[]>;
    get(credential: string | { id: string }, opts?: RequestOptions): Promise<Credential>;
    delete(credential: string | { id: string }, opts?: RequestOptions): Promise<void>;
  };

  runtimes(opts?: RequestOptions): Promise<Runtimes>;
  pools(opts?: RequestOptions): Promise<Pool[]>;
  usage(opts?: RequestOptions): Promise<Usage>;
  events(session: SessionRef, opts?: RequestOptions): Promise<SessionEvent[]>;
  /** Takes a screenshot and stores it as an artifact. */
  screenshot(session: SessionRef, opts?: RequestOptions): Promise<Artifact>;
  /** One computer-use action, or fill_credential. */
  action(session: SessionRef, action: Action, opts?: RequestOptions): Promise<ActionResult>;
  /** Starts a command; iterate the result for its output as it comes. */
  exec(session: SessionRef, req: ExecRequest | string[], opts?: RequestOptions): Promise<Execution>;
  /** Runs a command to its end. */
  run(session: SessionRef, req: ExecRequest | string[], opts?: RequestOptions): Promise<ExecResult>;
  shell(session: SessionRef, opts?: ShellOptions): Promise<Shell>;
  /** A fresh cdp preview and Playwright connected over CDP; the preview is revoked on disconnect. */
  connectPlaywright(session: SessionRef, opts?: ConnectPlaywrightOptions): Promise<PlaywrightBrowser>;
  /** A fresh cdp preview and Puppeteer connected to it; the preview is revoked on disconnect. */
  connectPuppeteer(session: SessionRef, opts?: ConnectPuppeteerOptions): Promise<PuppeteerBrowser>;
}

export default Sandgate;
